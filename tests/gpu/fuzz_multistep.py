"""Differential fuzz of multi-step scheduling on the CPU: random workloads run with one decode step per schedule and
with K (2, 3, 4 or 8), which must give the same outputs (tokens, text, finish and stop reasons, cumulative logprobs),
while every launch writes only into blocks its sequence owns alone and that are not prefix-cached (fuzz_harness.py).
Random block sizes (1-16), pool sizes, max_model_len, recompute or swap preemption, sync or async scheduling,
aborts, and requests with min_tokens, stop strings, stop token ids, logprobs, seeds, n=2, penalties, ignore_eos.

    python tests/gpu/fuzz_multistep.py [--seed 0] [--seconds 500]

Prints one line per case ('ok', 'DIFF' with the first differences, or 'ERROR' with a traceback).
Uses the default model (SmolLM2-135M, converted under ~/.cache/paged-infer on first use). No GPU needed.
"""
import argparse, sys, random, time, dataclasses
import os; HERE = os.path.dirname(os.path.abspath(__file__)); sys.path.insert(0, HERE)
import paged_infer.core.engine as E
_cache = {}
_orig = E.load_model
def cached(*a, **k):
    key = (a, tuple(sorted(k.items())))
    if key not in _cache: _cache[key] = _orig(*a, **k)
    return _cache[key]
E.load_model = cached
from paged_infer.core.engine import LLMEngine
from paged_infer.core.sampling_params import SamplingParams as SP
from fuzz_harness import run, compare

def make(seed, tok):
    rng = random.Random(seed)
    bs = rng.choice([1, 2, 4, 16])
    mml = rng.choice([None, 24, 40])
    mode = rng.choice(['recompute', 'swap'])
    async_ = rng.random() < 0.6
    nreq = rng.randrange(3, 9)
    reqs = []
    for i in range(nreq):
        plen = rng.randrange(1, 14)
        p = [rng.randrange(100, 20000) for _ in range(plen)]
        kind = rng.random()
        mt = rng.randrange(1, 20)
        if kind < 0.35: sp = SP(temperature=0, max_tokens=mt)
        elif kind < 0.45: sp = SP(temperature=0, max_tokens=mt, min_tokens=rng.randrange(0, mt + 1))
        elif kind < 0.55: sp = SP(temperature=0, max_tokens=mt, stop=[rng.choice(['e', ' the', ',', 'a'])])
        elif kind < 0.65: sp = SP(temperature=0, max_tokens=mt, stop_token_ids=[rng.randrange(100, 2000) for _ in range(20)], logprobs=rng.choice([None, 1]))
        elif kind < 0.75: sp = SP(temperature=0.9, seed=rng.randrange(100), max_tokens=mt, min_tokens=rng.randrange(0, mt + 1))
        elif kind < 0.82: sp = SP(temperature=0, max_tokens=mt, ignore_eos=True)
        elif kind < 0.9: sp = SP(n=2, temperature=0.8, seed=5, max_tokens=mt)
        else: sp = SP(temperature=0, max_tokens=mt, repetition_penalty=1.2)
        if mml and plen + sp.max_tokens > mml: sp = dataclasses.replace(sp, max_tokens=mml - plen, min_tokens=min(sp.min_tokens, mml - plen))
        reqs.append((p, sp, rng.randrange(0, 8)))
    need = max((len(p) + sp.max_tokens + bs - 1) // bs for p, sp, _ in reqs)
    blocks = need + rng.randrange(1, 3 * need + 2)
    aborts = {i: rng.randrange(0, 20) for i in range(nreq) if rng.random() < 0.2}
    K = rng.choice([2, 3, 4, 8])
    return dict(bs=bs, mml=mml, mode=mode, async_=async_, blocks=blocks, K=K), reqs, aborts

t0 = time.time()
ap = argparse.ArgumentParser(description='Multi-step scheduling against one step at a time on random workloads (CPU).')
ap.add_argument('--seed', type=int, default=0, help='the first case; cases count up from it')
ap.add_argument('--seconds', type=float, default=500, help='stop starting new cases after this long')
args = ap.parse_args()
seed = args.seed
tok = LLMEngine(num_gpu_blocks=8).tokenizer
while time.time() - t0 < args.seconds:
    cfg, reqs, aborts = make(seed, tok)
    res = []
    try:
        for K in (1, cfg['K']):
            kw = dict(num_gpu_blocks=cfg['blocks'], block_size=cfg['bs'], num_cpu_blocks=64, preemption_mode=cfg['mode'],
                      async_scheduling=cfg['async_'], num_scheduler_steps=K)
            if cfg['mml']: kw['max_model_len'] = cfg['mml']
            res.append(run(LLMEngine(**kw), reqs, abort_at=aborts))
        d = compare(res[0][0], res[1][0], skip=set(aborts))
        nm = sum(x is not None for x in res[1][1])
        print(seed, cfg, 'multi', nm, 'pre', res[0][2], res[1][2], 'DIFF' if d else 'ok', d[:2], flush=True)
    except Exception as e:
        import traceback; traceback.print_exc(); print(seed, cfg, 'ERROR', repr(e), flush=True)
    seed += 1
