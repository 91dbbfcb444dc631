import json, signal, socket, subprocess, sys, threading, time, httpx
with socket.socket() as sk:
    sk.bind(('127.0.0.1', 0)); port = sk.getsockname()[1]
log = open('serve120.log', 'w+')
proc = subprocess.Popen(['.venv/bin/paged-infer', 'serve', '--host', '127.0.0.1', '--port', str(port), '--shutdown-grace-s', '3',
                         '--uvicorn-log-level', 'warning'], stdout=log, stderr=subprocess.STDOUT)
url = f'http://127.0.0.1:{port}'
t0 = time.monotonic()
while True:
    try:
        if httpx.get(url + '/health', timeout=1).status_code == 200: break
    except httpx.TransportError: time.sleep(0.25)
body = {'model': 'SmolLM2-135M-Instruct', 'messages': [{'role': 'user', 'content': 'Tell me a long story.'}], 'max_tokens': 200, 'ignore_eos': True}
res = {}
def stream(i):
    try:
        with httpx.stream('POST', url + '/v1/chat/completions', json={**body, 'stream': True}, timeout=120) as r:
            ev = [l[6:] for l in r.iter_lines() if l.startswith('data: ')]
        res[i] = ('stream', len(ev), ev[-1], json.loads(ev[-2]).get('error', {}).get('code') if len(ev) > 1 else None)
    except Exception as e: res[i] = ('stream', 'EXC', repr(e))
def whole(i):
    try:
        r = httpx.post(url + '/v1/chat/completions', json=body, timeout=120)
        res[i] = ('whole', r.status_code, r.json().get('error', {}).get('code'))
    except Exception as e: res[i] = ('whole', 'EXC', repr(e))
ths = [threading.Thread(target=stream if i < 110 else whole, args=(i,)) for i in range(120)]
for t in ths: t.start()
time.sleep(8)
proc.send_signal(signal.SIGTERM); ts = time.monotonic()
for t in ths: t.join(120)
rc = proc.wait(60); print('exit', rc, 'after', round(time.monotonic() - ts, 1), 's')
from collections import Counter
print(Counter((v[0], v[2] if v[0] == 'stream' else v[1], v[3] if v[0] == 'stream' else v[2]) for v in res.values()))
print('stream events: min', min(v[1] for v in res.values() if v[0]=='stream' and v[1] != 'EXC'))
log.seek(0); text = log.read(); print('tracebacks', text.count('Traceback')); print('\n'.join(l for l in text.splitlines() if 'drain' in l or 'SIGTERM' in l or 'ERROR' in l)[:2000])
