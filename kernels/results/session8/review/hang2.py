import sys
import os; HERE = os.path.dirname(os.path.abspath(__file__)); sys.path.insert(0, HERE)
exec(open(os.path.join(HERE, 'fuzz.py')).read().split('t0 = time.time()')[0])
import harness
tok = LLMEngine(num_gpu_blocks=8).tokenizer
seed = int(sys.argv[1])
cfg, reqs, aborts = make(seed, tok)
print(cfg, aborts)
for p, sp, st in reqs: print(len(p), sp.max_tokens, sp.n, sp.repetition_penalty, st)
kw = dict(num_gpu_blocks=cfg['blocks'], block_size=cfg['bs'], num_cpu_blocks=64, preemption_mode=cfg['mode'],
          async_scheduling=cfg['async_'], num_scheduler_steps=1)
if cfg['mml']: kw['max_model_len'] = cfg['mml']
eng = LLMEngine(**kw)
ids = {}
for step in range(400):
    for i, (p, sp, st) in enumerate(reqs):
        if st == step: ids[i] = eng.add_request(p, sp)
    for i, s in aborts.items():
        if s == step and i in ids: eng.abort(ids[i])
    eng.step()
s = eng.scheduler
print('running', [(g.request_id, [(q.num_tokens, q.num_computed_tokens, q.status.name) for q in g.seqs]) for g in s.running])
print('waiting', [(g.request_id, [(q.num_tokens, q.status.name) for q in g.seqs]) for g in s.waiting])
print('swapped', [(g.request_id, [(q.num_tokens, q.status.name) for q in g.seqs]) for g in s.swapped])
print('free', eng.block_manager.num_free_blocks, 'cpu free', eng.block_manager.cpu.num_free, 'watermark', eng.block_manager.watermark_blocks, 'preempt', s.num_preemptions)
out = s.schedule(1); print('sched', [(q.request_id, n) for q, n in zip(out.seqs, out.num_new_tokens)], out.preempted)
