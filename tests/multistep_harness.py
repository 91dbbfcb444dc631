"""Helpers of test_multistep_fuzz.py: run an engine over timed arrivals and aborts with every launch checked, compare outputs."""
import random, time, sys
import torch
from paged_infer.core.engine import LLMEngine
from paged_infer.core.sampling_params import SamplingParams
from paged_infer.core.sequence import SequenceStatus

def instrument(eng, log):
    """Check every launch: each position it writes lies in a block the sequence owns alone and that is not cached."""
    orig = eng.runner.launch
    bm = eng.block_manager
    B = bm.block_size
    def launch(seqs, n, tables, prev=None, num_steps=None):
        for i, (s, k) in enumerate(zip(seqs, n)):
            t = bm.tables[s.seq_id]
            assert tables[i] is t.blocks
            steps = num_steps[i] if num_steps else 1
            start = s.num_computed_tokens
            pos = list(range(start, start + k)) + list(range(start + k, start + k + steps - 1))
            for p in pos:
                assert p < t.num_tokens, (s.seq_id, p, t.num_tokens, s.num_tokens, steps)
                assert p < eng.max_model_len, (p, eng.max_model_len)
                b = t.blocks[p // B]
                blk = bm.gpu.blocks[b]
                assert blk.ref_count == 1, ('shared block written', s.seq_id, p, b, blk.ref_count)
                assert blk.hash is None, ('cached block written', s.seq_id, p, b)
        log.append(num_steps)
        return orig(seqs, n, tables, prev, num_steps)
    eng.runner.launch = launch

def run(eng, reqs, abort_at=None, check=True, seed=0):
    """reqs: list of (prompt, params, arrive_step). abort_at: {req index: step}"""
    log = []
    instrument(eng, log)
    ids = {}
    done = {}
    step = 0
    pending = sorted(range(len(reqs)), key=lambda i: reqs[i][2])
    while pending or eng.has_unfinished_requests():
        while pending and reqs[pending[0]][2] <= step:
            i = pending.pop(0); ids[i] = eng.add_request(reqs[i][0], reqs[i][1])
        if abort_at:
            for i, st in abort_at.items():
                if st == step and i in ids: eng.abort(ids[i])
        for o in eng.step():
            if o.finished: done[o.request_id] = o
        if check: eng.block_manager.check_invariants()
        step += 1
        assert step < 3000
    bm = eng.block_manager
    assert bm.num_free_blocks == bm.gpu.num_blocks, 'gpu blocks leaked'
    assert bm.cpu.num_free == bm.cpu.num_blocks, 'cpu blocks leaked'
    assert not eng.detoks and not eng.groups
    res = {}
    for i, rid in ids.items():
        o = done.get(rid)
        if o is None: res[i] = None; continue
        res[i] = [(c.token_ids, c.text, c.finish_reason, c.stop_reason, c.cumulative_logprob, c.logprobs) for c in o.outputs]
    return res, log, eng.scheduler.num_preemptions, eng.num_generation_tokens

def compare(a, b, skip=(), lp_tol=1e-4):
    diffs = []
    for i in a:
        if i in skip: continue
        if a[i] is None or b[i] is None:
            if a[i] != b[i]: diffs.append((i, 'none', a[i] is None, b[i] is None))
            continue
        for ca, cb in zip(a[i], b[i]):
            if ca[:4] != cb[:4]: diffs.append((i, 'main', ca[:4], cb[:4]))
            elif ca[4] is not None and abs(ca[4] - cb[4]) > lp_tol: diffs.append((i, 'cum', ca[4], cb[4]))
    return diffs
