"""Multi-step scheduling against one step at a time, on seeded random workloads (a differential fuzz, CPU).

Each case runs the same requests (timed arrivals, aborts) through two engines, one decode step per schedule and K
(2, 3, 4 or 8), which must give the same outputs (tokens, text, finish and stop reasons, cumulative logprobs), while
every launch writes only into blocks its sequence owns alone and that are not prefix-cached (multistep_harness.py).
Random block sizes (1-16), pool sizes, max_model_len, recompute or swap preemption, sync or async scheduling, and
requests with min_tokens, stop strings, stop token ids, logprobs, seeds, n=2, penalties, ignore_eos.
`tests/gpu/fuzz_multistep.py` runs more cases for as long as asked.
"""
import dataclasses
import random

import pytest

import paged_infer.core.engine as engine_module
from paged_infer.core.engine import LLMEngine
from paged_infer.core.sampling_params import SamplingParams as SP
from multistep_harness import compare, run

_models = {}
_load_model = engine_module.load_model


def _cached_load_model(*args, **kwargs):
    "The default model once per process: each case builds two engines."
    key = (args, tuple(sorted(kwargs.items())))
    if key not in _models:
        _models[key] = _load_model(*args, **kwargs)
    return _models[key]


def make(seed: int) -> tuple:
    "Case `seed`: engine settings, requests (prompt, params, arrival step) and aborts {request: step}."
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
    need = max(sp.num_seqs_to_sample * -(-(len(p) + sp.max_tokens) // bs) for p, sp, _ in reqs)  # each fits (check_fits)
    need = max(need, -(-(mml or 0) // bs))  # and so does one sequence of max_model_len
    blocks = need + rng.randrange(1, 3 * need + 2)
    aborts = {i: rng.randrange(0, 20) for i in range(nreq) if rng.random() < 0.2}
    K = rng.choice([2, 3, 4, 8])
    return dict(bs=bs, mml=mml, mode=mode, async_=async_, blocks=blocks, K=K), reqs, aborts


def run_case(seed: int) -> tuple:
    "Run case `seed` with one step and with K steps a schedule: (its settings, the differences found)."
    engine_module.load_model = _cached_load_model
    try:
        cfg, reqs, aborts = make(seed)
        res = []
        for k in (1, cfg['K']):
            kw = dict(num_gpu_blocks=cfg['blocks'], block_size=cfg['bs'], num_cpu_blocks=64, preemption_mode=cfg['mode'],
                      async_scheduling=cfg['async_'], num_scheduler_steps=k)
            if cfg['mml']:
                kw['max_model_len'] = cfg['mml']
            res.append(run(LLMEngine(**kw), reqs, abort_at=aborts))
    finally:
        engine_module.load_model = _load_model
    return cfg, compare(res[0][0], res[1][0], skip=set(aborts))


@pytest.mark.parametrize("seed", range(6))
def test_multistep_matches_one_step(seed):
    cfg, diffs = run_case(seed)
    assert not diffs, (cfg, diffs[:3])
