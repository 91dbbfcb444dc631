"""Two `paged-infer serve` replicas behind Nginx (the Debian package) with the repository's deploy/nginx/nginx.conf,
driven by the official openai client on loopback.

One test, in steps, over one pair of replicas: requests spread over both and all complete; a session id keeps to its
replica; a client that hangs up mid-stream through Nginx stops the request on the replica; a replica killed mid-run
loses only the streams it was serving, and Nginx sends everything after to the other one; the killed replica,
started again, takes its sessions back; a replica that drains (SIGTERM) finishes its stream while Nginx sends its
sessions elsewhere, then exits 0.
"""
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from helpers import metric

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / 'deploy' / 'nginx' / 'nginx.conf'
NGINX = shutil.which('nginx') or ('/usr/sbin/nginx' if Path('/usr/sbin/nginx').exists() else None)
pytestmark = pytest.mark.skipif(NGINX is None, reason='no nginx (Debian package `nginx`, installed by make install)')
MODEL = 'SmolLM2-135M-Instruct'


def free_port() -> int:
    """A free port below the kernel's ephemeral range: a replica binds it only once its model is loaded, and meanwhile
    no socket bound to port 0 and no outgoing connection (both drawn from that range) can take it."""
    low = int(Path('/proc/sys/net/ipv4/ip_local_port_range').read_text().split()[0])
    for port in random.sample(range(max(1024, low - 12000), low), 500):
        with socket.socket() as s:
            try:
                s.bind(('127.0.0.1', port))
            except OSError:
                continue
            return port
    raise RuntimeError('no free port below the ephemeral range')


def start_replica(port: int, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, '-c', 'import sys; from paged_infer.entrypoints.cli import main; sys.exit(main())',
           'serve', '--host', '127.0.0.1', '--port', str(port), '--num-gpu-blocks-override', '128',
           '--max-model-len', '512', '--shutdown-grace-s', '60', '--uvicorn-log-level', 'warning']
    with open(log, 'a') as out:  # the child keeps its own copy of the file
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)


def wait_ready(url: str, proc: subprocess.Popen | None = None, timeout: float = 180):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        assert proc is None or proc.poll() is None, f'{url} exited with {proc.returncode}'
        try:
            if httpx.get(url + '/health', timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    raise TimeoutError(f'{url} not ready in {timeout} s')


def nginx_conf(lb: int, a: int, b: int) -> str:
    "The repository's config with the test's ports: each address replaced exactly once."
    text = CONF.read_text()
    for old, new in [('127.0.0.1:8000', f'127.0.0.1:{lb}'), ('127.0.0.1:8001', f'127.0.0.1:{a}'),
                     ('127.0.0.1:8002', f'127.0.0.1:{b}')]:
        assert text.count(old) == 1, f'{CONF} should name {old} once'
        text = text.replace(old, new)
    return text


def aborted(url: str) -> float:
    return metric(url, 'paged_infer:request_success_total', finished_reason='abort')


def draining(url: str) -> bool:
    try:
        return httpx.get(url + '/health', timeout=5).status_code == 503
    except httpx.TransportError:
        return False


def upstream(headers) -> str:
    "The replica that answered: the last address of Nginx's X-Upstream (earlier ones were tried and failed)."
    return headers['x-upstream'].split(',')[-1].strip()


def chat(client, session: str, max_tokens: int = 8) -> tuple:
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{'role': 'user', 'content': f'Say hello to {session}.'}], max_tokens=max_tokens,
        temperature=0, extra_headers={'X-Session-Id': session})
    out = raw.parse()
    assert out.choices[0].finish_reason in ('stop', 'length'), out
    return upstream(raw.headers), out


class Stream(threading.Thread):
    "A streamed completion through the balancer in a thread: its replica, its chunks, and how it ended."

    def __init__(self, client, session: str, max_tokens: int = 120):
        super().__init__(daemon=True)
        self.client, self.session, self.max_tokens = client, session, max_tokens
        self.chunks, self.finish, self.error, self.replica = 0, None, None, None

    def run(self):
        try:
            raw = self.client.completions.with_raw_response.create(
                model=MODEL, prompt='Once upon a time', max_tokens=self.max_tokens, stream=True,
                extra_body={'ignore_eos': True}, extra_headers={'X-Session-Id': self.session})
            self.replica = upstream(raw.headers)
            for chunk in raw.parse():
                self.chunks += 1
                self.finish = chunk.choices[0].finish_reason or self.finish
        except Exception as e:  # the client's view of a replica that died mid-stream
            self.error = e


def wait_for(cond, timeout: float, what: str):
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, f'timed out: {what}'
        time.sleep(0.05)


@pytest.fixture
def cluster(tmp_path):
    "Two replicas and Nginx in front of them; everything killed at the end."
    tmp_path.chmod(0o755)  # nginx's workers (user nobody) reach their temporary folders
    ports = set()
    while len(ports) < 3:  # three different ones
        ports.add(free_port())
    lb, a, b = sorted(ports)
    urls = {a: f'http://127.0.0.1:{a}', b: f'http://127.0.0.1:{b}'}
    procs, nginx = {}, None
    c = dict(lb=f'http://127.0.0.1:{lb}', urls=urls, procs=procs, ports=(a, b), log=tmp_path)
    try:
        for p in (a, b):
            procs[p] = start_replica(p, tmp_path / f'replica-{p}.log')
        (tmp_path / 'nginx.conf').write_text(nginx_conf(lb, a, b))
        with open(tmp_path / 'nginx.log', 'w') as out:
            nginx = subprocess.Popen([NGINX, '-p', str(tmp_path), '-c', str(tmp_path / 'nginx.conf'),
                                      '-g', 'daemon off;'], stdout=out, stderr=subprocess.STDOUT)
        for p in (a, b):
            wait_ready(urls[p], procs[p])
        wait_ready(c['lb'], nginx, timeout=10)
        yield c
    finally:
        if nginx is not None and nginx.poll() is None:
            nginx.terminate()  # SIGTERM: the master stops its workers (a SIGKILL would leave them serving the port)
            try:
                nginx.wait(10)
            except subprocess.TimeoutExpired:
                nginx.kill()
                nginx.wait()
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()


def test_two_replicas_behind_nginx(cluster):
    a, b = cluster['ports']
    urls, procs = cluster['urls'], cluster['procs']
    addr = {p: f'127.0.0.1:{p}' for p in (a, b)}
    client = openai.OpenAI(base_url=cluster['lb'] + '/v1', api_key='unused', max_retries=0, timeout=120)

    # 1. Sixteen sessions at once: every answer completes, and both replicas serve.
    home, threads = {}, []
    for i in range(16):
        s = f'session-{i}'
        threads.append(threading.Thread(target=lambda s=s: home.__setitem__(s, chat(client, s)[0])))
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(home) == 16, home
    assert set(home.values()) == {addr[a], addr[b]}, home
    i = 16
    while min(list(home.values()).count(addr[p]) for p in (a, b)) < 4 and i < 64:  # four sessions on each, for below
        home[f'session-{i}'] = chat(client, f'session-{i}')[0]
        i += 1

    # 2. A session keeps to its replica, so its prefix stays cached there.
    for s in ['session-0', 'session-1', 'session-2']:
        assert [chat(client, s)[0] for _ in range(3)] == [home[s]] * 3, s
    on = {p: [s for s, r in home.items() if r == addr[p]] for p in (a, b)}

    # 3. A client that hangs up mid-stream through Nginx: the replica aborts the request (it had 300 tokens to go).
    before = aborted(urls[a])
    with httpx.stream('POST', cluster['lb'] + '/v1/completions', timeout=60, headers={'X-Session-Id': on[a][0]},
                      json={'model': MODEL, 'prompt': 'Once', 'max_tokens': 300, 'ignore_eos': True, 'stream': True}) as r:
        assert upstream(r.headers) == addr[a]
        lines = r.iter_lines()
        for _ in range(6):
            next(lines)
    wait_for(lambda: aborted(urls[a]) == before + 1, 15, 'the replica to abort the request of a client that hung up')
    wait_for(lambda: metric(urls[a], 'paged_infer:num_requests_running') == 0, 15, 'the request to leave the batch')

    # 4. Kill replica a while two streams run on each replica: a's streams fail, b's complete.
    streams = [Stream(client, s) for s in on[a][:2] + on[b][:2]]
    for st in streams:
        st.start()
    wait_for(lambda: all(st.chunks >= 3 for st in streams), 60, 'every stream to begin')
    procs[a].send_signal(signal.SIGKILL)
    procs[a].wait()
    for st in streams:
        st.join(120)
    for st in streams:
        if st.replica == addr[a]:
            assert st.error is not None and st.finish is None, (st.session, st.chunks, st.finish)
        else:
            assert st.error is None and st.finish == 'length', (st.session, st.error)
    # Nginx moves on: a's sessions are answered by b, with no error seen by the client.
    for s in on[a][:4]:
        assert chat(client, s)[0] == addr[b], s

    # 5. a starts again and, once Nginx retries it (fail_timeout 5 s), takes its sessions back.
    procs[a] = start_replica(a, cluster['log'] / f'replica-{a}.log')
    wait_ready(urls[a], procs[a])
    wait_for(lambda: chat(client, on[a][0])[0] == addr[a], 30, 'a to take its session back')

    # 6. b drains (SIGTERM) while it streams: the stream runs to its end, b's sessions go to a meanwhile, b exits 0.
    st = Stream(client, on[b][0], max_tokens=150)
    st.start()
    wait_for(lambda: st.chunks >= 3, 60, 'the stream on b to begin')
    procs[b].send_signal(signal.SIGTERM)
    wait_for(lambda: draining(urls[b]), 10, 'b to say it drains')
    assert httpx.get(urls[b] + '/health', timeout=5).json()['error']['code'] == 'draining'
    for s in on[b][1:4]:
        assert chat(client, s)[0] == addr[a], s
    st.join(120)
    assert st.error is None and st.finish == 'length', (st.error, st.chunks)
    assert procs[b].wait(timeout=60) == 0
    assert re.search(r'SIGTERM: draining', (cluster['log'] / f'replica-{b}.log').read_text())
