"""The engine keeps greedy outputs token-identical to Hugging Face under every kind of pressure, and loses nothing.

(a) one mixed batch; (b) a pool so small that requests are preempted, by recompute and by swap; (c) a token budget
small enough to force chunked prefill; (d) prefix-cache hits on a shared system prompt. Then parallel sampling sharing
prompt blocks, beam search against Hugging Face's beam search, a workload larger than the pool, and random aborts.
"""
import random

import pytest
import torch
from transformers import AutoModelForCausalLM

from paged_infer.model.default_model import prepare_default_model
from paged_infer.entrypoints.llm import LLM
from paged_infer.core.config import EngineConfig, EngineConfigError
from paged_infer.core.engine import LLMEngine
from paged_infer.core.errors import RequestError
from paged_infer.worker.model_runner import load_model, rows_kept
from paged_infer.core.sampling_params import SamplingParams

N_NEW = 24
QUESTIONS = ['Hi there!', 'What is the capital of France?', 'Write a short haiku about memory and forgetting, please.',
             'List three uses of a hash table, and say which one you like best and why, in detail.']
TEXTS = ['The quick brown fox', 'def fibonacci(n):', 'Once upon a time, in a land far away, there lived a',
         'PagedAttention is an attention algorithm inspired by the classical idea of virtual memory and paging in '
         'operating systems. Unlike the traditional attention algorithms, it']
SYSTEM = ('You are a meticulous assistant for a library. You answer questions about books, authors and opening hours. '
          'Keep answers short, polite and factual; when unsure, say so and suggest asking a librarian at the desk.')


@pytest.fixture(scope='module')
def shared():
    """One engine-free setup: the tokenizer, the prompts and Hugging Face's greedy references (computed once)."""
    hf = AutoModelForCausalLM.from_pretrained(prepare_default_model(), dtype=torch.float32).eval()
    eng = LLMEngine(num_gpu_blocks=8)
    tok = eng.tokenizer
    chat = lambda q, sys=None: tok.apply_chat_template(([{'role': 'system', 'content': sys}] if sys else []) +
                                                       [{'role': 'user', 'content': q}], add_generation_prompt=True,
                                                       tokenize=True, return_dict=False)
    prompts = [chat(q) for q in QUESTIONS] + [tok.encode(t) for t in TEXTS]
    shared_prefix = [chat(q, SYSTEM) for q in QUESTIONS]

    def ref(p, n=N_NEW):
        out = hf.generate(torch.tensor([p]), max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=tok.eos_token_id)
        return out[0, len(p):].tolist()
    return dict(hf=hf, tok=tok, prompts=prompts, refs=[ref(p) for p in prompts],
                shared_prefix=shared_prefix, shared_refs=[ref(p) for p in shared_prefix])


def run(engine, prompts, params, stagger=False):
    ids = []
    for i, p in enumerate(prompts):
        ids.append(engine.add_request(p, params))
        if stagger and i == 0:  # the first request's prompt is computed (and cached) before the others arrive
            engine.step()
            assert engine.scheduler.running[0].seqs[0].num_computed_tokens >= len(p)
    done = {}
    steps = 0
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished: done[o.request_id] = o
        steps += 1
        engine.block_manager.check_invariants()
    assert engine.block_manager.num_free_blocks == engine.num_gpu_blocks, 'blocks leaked'
    assert engine.block_manager.cpu.num_free == engine.block_manager.cpu.num_blocks, 'swap blocks leaked'
    return [done[r].outputs[0].token_ids for r in ids]


GREEDY = SamplingParams(temperature=0, max_tokens=N_NEW, min_tokens=N_NEW)


# each engine test runs twice: waiting for every step (sync), and scheduling step t+1 while step t runs (async)
ASYNC = pytest.mark.parametrize('async_scheduling', [False, True], ids=['sync', 'async'])


@ASYNC
def test_a_mixed_batch(shared, async_scheduling):
    eng = LLMEngine(num_gpu_blocks=128, async_scheduling=async_scheduling)
    assert run(eng, shared['prompts'], GREEDY) == shared['refs']


@ASYNC
def test_tokens_per_step_counts_each_step_alone(async_scheduling):
    "Overlapped steps finish one step while launching the next: each step's tokens are still counted as one step."
    eng = LLMEngine(num_gpu_blocks=32, async_scheduling=async_scheduling)
    prompts = [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11, 12]]
    run(eng, prompts, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    # one prefill step (12 prompt tokens and a first token each), then three decode steps of two tokens
    assert eng.tokens_per_step == {14: 1, 2: 3}, eng.tokens_per_step
    assert sum(n * k for n, k in eng.tokens_per_step.items()) == eng.num_prompt_tokens + eng.num_generation_tokens


@ASYNC
@pytest.mark.parametrize('mode', ['recompute', 'swap'])
def test_b_preemption(shared, mode, async_scheduling):
    eng = LLMEngine(num_gpu_blocks=14, num_cpu_blocks=64, preemption_mode=mode, async_scheduling=async_scheduling)
    assert run(eng, shared['prompts'], GREEDY) == shared['refs']
    assert eng.scheduler.num_preemptions > 0, 'the pool was meant to be too small'


@ASYNC
def test_c_chunked_prefill(shared, async_scheduling):
    eng = LLMEngine(num_gpu_blocks=128, max_num_batched_tokens=16, async_scheduling=async_scheduling)
    chunks = []
    orig = eng.runner.launch

    def spy(seqs, n, tables, prev=None, num_steps=None):
        chunks.extend(k for s, k in zip(seqs, n) if k < s.num_uncomputed_tokens)
        return orig(seqs, n, tables, prev, num_steps)
    eng.runner.launch = spy
    assert run(eng, shared['prompts'], GREEDY) == shared['refs']
    assert chunks, 'some prompts must have run in chunks'


@ASYNC
def test_d_prefix_caching(shared, async_scheduling):
    eng = LLMEngine(num_gpu_blocks=128, async_scheduling=async_scheduling)
    assert run(eng, shared['shared_prefix'], GREEDY, stagger=True) == shared['shared_refs']
    s = eng.stats()
    assert s.prefix_cache_hits >= 3 * 48, f'{s.prefix_cache_hits} tokens from the prefix cache'


def test_parallel_sampling_shares_prompt_blocks(shared):
    eng = LLMEngine(num_gpu_blocks=64)
    p = shared['prompts'][3]  # 48 tokens: 3 blocks
    eng.add_request(p, SamplingParams(n=4, temperature=1.0, seed=7, max_tokens=8), 'n4')
    eng.step()  # prefill: one sequence, 4 samples, forked into 4 sequences
    g = eng.groups['n4']
    assert len(g.seqs) == 4
    eng.step()  # each writes its first sampled token: the shared last block is copied where it is partly full
    used = eng.num_gpu_blocks - eng.block_manager.num_free_blocks
    prompt_blocks = -(-len(p) // 16)
    assert used <= prompt_blocks + 4, f'{used} blocks: the prompt blocks are shared, not copied 4 times'
    assert used < 4 * prompt_blocks
    while eng.has_unfinished_requests(): eng.step()
    assert eng.block_manager.num_free_blocks == eng.num_gpu_blocks


def test_seeded_sampling_is_reproducible_in_any_batch(shared):
    p = shared['prompts'][1]
    params = SamplingParams(temperature=0.9, top_p=0.9, seed=1234, max_tokens=12, n=2)
    alone = LLMEngine(num_gpu_blocks=64)
    alone.add_request(p, params, 'x')
    a = None
    while alone.has_unfinished_requests():
        for o in alone.step():
            if o.finished: a = [c.token_ids for c in o.outputs]
    crowd = LLMEngine(num_gpu_blocks=64)
    for i, q in enumerate(shared['prompts'][:5]): crowd.add_request(q, SamplingParams(temperature=1.0, max_tokens=10), f'o{i}')
    crowd.add_request(p, params, 'x')
    b = None
    while crowd.has_unfinished_requests():
        for o in crowd.step():
            if o.request_id == 'x' and o.finished: b = [c.token_ids for c in o.outputs]
    assert a == b and a[0] != a[1]


@pytest.mark.parametrize('early_stopping,length_penalty', [(True, 1.0), (False, 1.0), (False, 0.5)])
def test_beam_search_matches_hf(shared, early_stopping, length_penalty):
    hf, tok = shared['hf'], shared['tok']
    eng = LLMEngine(num_gpu_blocks=128)
    W, n, max_new = 3, 2, 12
    for p in shared['prompts'][:3]:
        eng.add_request(p, SamplingParams(temperature=0, use_beam_search=True, best_of=W, n=n, max_tokens=max_new,
                                          early_stopping=early_stopping, length_penalty=length_penalty), 'b')
        out = None
        while eng.has_unfinished_requests():
            for o in eng.step():
                if o.finished: out = o
        ref = hf.generate(torch.tensor([p]), num_beams=W, num_return_sequences=n, max_new_tokens=max_new, do_sample=False,
                          early_stopping=early_stopping, length_penalty=length_penalty, pad_token_id=tok.eos_token_id)
        ours = [c.token_ids for c in out.outputs]
        theirs = [r[len(p):].tolist() for r in ref]
        for t, o in zip(theirs, ours): assert set(t[len(o):]) <= {tok.eos_token_id}, 'HF only pads after our hypothesis'
        assert ours == [t[:len(o)] for t, o in zip(theirs, ours)], (ours, theirs)
        assert eng.block_manager.num_free_blocks == eng.num_gpu_blocks


def test_workload_larger_than_pool_completes():
    llm = LLM(num_gpu_blocks=24, max_num_batched_tokens=64)
    rng = random.Random(0)
    prompts = [{'prompt_token_ids': [rng.randrange(100, 40000) for _ in range(rng.randint(5, 60))]} for _ in range(24)]
    params = [SamplingParams(temperature=0.8, seed=i, max_tokens=rng.randint(4, 40), ignore_eos=True) for i in range(24)]
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outs] == [p.max_tokens for p in params]
    assert llm.engine.block_manager.num_free_blocks == 24 and llm.engine.scheduler.num_preemptions > 0


def test_bad_requests_are_refused_and_lose_nothing():
    eng = LLMEngine(num_gpu_blocks=32, max_model_len=64)
    ok = eng.add_request('Hello', SamplingParams(max_tokens=5))
    for bad, param in [(('', SamplingParams()), 'prompt'), (([10**9], SamplingParams()), 'prompt'),
                       (('Hello', SamplingParams(max_tokens=100)), 'max_tokens')]:
        with pytest.raises(RequestError) as e: eng.add_request(*bad)
        assert e.value.param == param
    with pytest.raises(RequestError): eng.add_request('again', SamplingParams(), request_id=ok)
    while eng.has_unfinished_requests(): eng.step()
    assert eng.block_manager.num_free_blocks == 32


@pytest.fixture(scope='module')
def small_engines():
    return {a: LLMEngine(num_gpu_blocks=20, num_cpu_blocks=16, max_num_batched_tokens=32, async_scheduling=a) for a in (False, True)}


from hypothesis import HealthCheck, given, settings, strategies as st


@settings(max_examples=16, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_aborts_leak_nothing(small_engines, data):
    """Requests of every kind (greedy, n > 1, best_of, beams, stop strings), aborted at random moments under preemption,
    with and without async scheduling."""
    eng = small_engines[data.draw(st.booleans())]
    eng.scheduler.config.preemption_mode = data.draw(st.sampled_from(['recompute', 'swap']))
    eng.config.num_scheduler_steps = data.draw(st.sampled_from([1, 3]))  # multi-step: several decode steps per schedule
    kinds = [SamplingParams(temperature=0, max_tokens=12), SamplingParams(n=3, temperature=1.0, seed=1, max_tokens=10),
             SamplingParams(best_of=3, n=2, temperature=0.7, max_tokens=8),
             SamplingParams(use_beam_search=True, best_of=3, n=2, temperature=0, max_tokens=6),
             SamplingParams(temperature=0, stop=['e'], max_tokens=12)]
    ids = []
    for i in range(data.draw(st.integers(1, 6))):
        n = data.draw(st.integers(1, 40))
        ids.append(eng.add_request(data.draw(st.lists(st.integers(100, 40000), min_size=n, max_size=n)),
                                   data.draw(st.sampled_from(kinds))))
    # The aborts are drawn before the run, not during it: how many steps a run takes depends on sampling, and
    # hypothesis replays an example only if it draws the same data the same way.
    aborts = {}  # step -> the requests aborted before it
    for step, i in data.draw(st.lists(st.tuples(st.integers(0, 40), st.integers(0, len(ids) - 1)), max_size=8)):
        aborts.setdefault(step, []).append(ids[i])
    steps = 0
    while eng.has_unfinished_requests():
        for request_id in aborts.get(steps, []): eng.abort(request_id)
        eng.step(); steps += 1
        eng.block_manager.check_invariants()
        assert steps < 500
    assert eng.block_manager.num_free_blocks == eng.num_gpu_blocks and eng.block_manager.cpu.num_free == 16
    assert not eng.detoks, 'per-sequence state is dropped with the request'


# Async scheduling (chapter 13): the same outputs as waiting for every step, whatever finishes a request while the
# next step is already running, and nothing lost when a request is aborted or needs every token on the host.

def run_all(eng, reqs):
    ids = [eng.add_request(p, sp) for p, sp in reqs]
    done, overlapped = {}, 0
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished: done[o.request_id] = o
        overlapped += eng.inflight is not None
        eng.block_manager.check_invariants()
    assert eng.inflight is None and eng.block_manager.num_free_blocks == eng.num_gpu_blocks
    return [done[r] for r in ids], overlapped


def summary(o):
    return [(c.token_ids, c.text, c.finish_reason, c.stop_reason, c.logprobs) for c in o.outputs]


def test_async_matches_sync_on_stops_seeds_and_logprobs(shared):
    """eos, stop strings, stop token ids, max_tokens, min_tokens, logprobs and seeded sampling: identical outputs."""
    p = shared['prompts']
    kinds = [SamplingParams(temperature=0, max_tokens=40), SamplingParams(temperature=0, stop=[' the', '.'], max_tokens=30),
             SamplingParams(temperature=0, stop_token_ids=[13], max_tokens=30, logprobs=3),
             SamplingParams(temperature=0.9, seed=7, max_tokens=25), SamplingParams(temperature=0, max_tokens=5),
             SamplingParams(temperature=0, min_tokens=12, max_tokens=20), SamplingParams(temperature=0.7, top_p=0.9, seed=3, max_tokens=18, logprobs=1),
             SamplingParams(temperature=0, max_tokens=1)]
    reqs = [(p[i % len(p)], k) for i, k in enumerate(kinds)]
    sync, n_sync = run_all(LLMEngine(num_gpu_blocks=64, async_scheduling=False), reqs)
    asyn, n_async = run_all(LLMEngine(num_gpu_blocks=64, async_scheduling=True), reqs)
    assert n_sync == 0 and n_async > 10, 'the async engine had a step in flight after most steps'
    for a, b in zip(sync, asyn):
        (ta, xa, fa, ra, la), = summary(a); (tb, xb, fb, rb, lb), = summary(b)
        assert (ta, xa, fa, ra) == (tb, xb, fb, rb)
        if la is not None: assert all(d1.keys() == d2.keys() and all(abs(d1[k] - d2[k]) < 1e-4 for k in d1) for d1, d2 in zip(la, lb))
    assert {a.outputs[0].finish_reason for a in sync} == {'stop', 'length'}


def test_async_waits_while_a_request_needs_every_token(shared):
    """Forks (n > 1), beams and penalties need each token on the host before the next step: the engine stops
    overlapping while such a request runs, then resumes; outputs are those of the sync engine."""
    p = shared['prompts']
    reqs = [(p[0], SamplingParams(temperature=0, max_tokens=30)), (p[1], SamplingParams(temperature=0, max_tokens=30)),
            (p[2], SamplingParams(n=2, temperature=0.8, seed=1, max_tokens=6)),
            (p[3], SamplingParams(temperature=0, presence_penalty=0.5, repetition_penalty=1.2, max_tokens=8)),
            (p[4], SamplingParams(use_beam_search=True, best_of=2, temperature=0, max_tokens=4))]
    sync, _ = run_all(LLMEngine(num_gpu_blocks=64, async_scheduling=False), reqs)
    eng = LLMEngine(num_gpu_blocks=64, async_scheduling=True)
    ids = [eng.add_request(q, sp) for q, sp in reqs]
    done, seen = {}, []
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished: done[o.request_id] = o
        seen.append((bool(eng.sync_only), eng.inflight is not None))
    assert (True, True) not in seen, 'never a step in flight while a request needs every token'
    assert (False, True) in seen, 'overlapping again once they finished'
    assert [summary(done[i]) for i in ids] == [summary(o) for o in sync]
    assert eng.block_manager.num_free_blocks == eng.num_gpu_blocks and not eng.detoks


def test_async_abort_while_a_step_is_in_flight(shared):
    p, params = shared['prompts'], SamplingParams(temperature=0, max_tokens=20)
    alone = [run_all(LLMEngine(num_gpu_blocks=64, async_scheduling=True), [(q, params)])[0][0].outputs[0].token_ids for q in p[:3]]
    eng = LLMEngine(num_gpu_blocks=64, async_scheduling=True)
    ids = [eng.add_request(q, params) for q in p[:3]]
    done = {}
    while eng.inflight is None or not any(s.num_pending_tokens for g in eng.scheduler.running for s in g.seqs): eng.step()
    assert eng.abort(ids[1]) and eng.inflight is not None  # its token is still on the device
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished: done[o.request_id] = o
    assert ids[1] not in done and [done[ids[0]].outputs[0].token_ids, done[ids[2]].outputs[0].token_ids] == [alone[0], alone[2]]
    assert eng.block_manager.num_free_blocks == eng.num_gpu_blocks and not eng.detoks and not eng.sync_only


@ASYNC
def test_final_only_outputs_come_once(shared, async_scheduling):
    """RequestOutputKind.FINAL_ONLY (what LLM.generate asks for): no output until the request finishes, then the
    same one as a CUMULATIVE request's last, text included."""
    from paged_infer.core.sampling_params import RequestOutputKind
    eng = LLMEngine(num_gpu_blocks=64, async_scheduling=async_scheduling)
    p = shared['prompts']
    eng.add_request(p[0], SamplingParams(temperature=0, max_tokens=12), 'cumulative')
    eng.add_request(p[0], SamplingParams(temperature=0, max_tokens=12, output_kind=RequestOutputKind.FINAL_ONLY), 'final')
    seen = {'cumulative': [], 'final': []}
    while eng.has_unfinished_requests():
        for o in eng.step(): seen[o.request_id].append(o)
    assert len(seen['cumulative']) >= 12 and len(seen['final']) == 1 and seen['final'][0].finished
    final, last = seen['final'][0].outputs[0], seen['cumulative'][-1].outputs[0]
    assert (final.token_ids, final.finish_reason) == (last.token_ids, last.finish_reason) and final.token_ids
    assert final.text == last.text and final.text  # decoded at the end in one call (deferred, chapter 10), token by token
    assert eng.block_manager.num_free_blocks == eng.num_gpu_blocks and not eng.detoks


@ASYNC
def test_final_only_text_of_a_request_that_fails_midway(shared, async_scheduling):
    """A FINAL_ONLY request whose text is read before it ends (its logits processor fails at the 8th token, the 7th forced
    to half a character; its text is decoded at the end, chapter 10's deferred detokenizer) gets the text a CUMULATIVE
    twin's token-by-token decoding gave."""
    from paged_infer.core.sampling_params import RequestOutputKind
    half = shared['tok'].convert_tokens_to_ids('Ã')  # byte 0xC3 alone: the first half of 'é' (byte-level BPE)
    def boom(out, logits):
        if len(out) == 7: raise ZeroDivisionError('boom')
        if len(out) == 6: logits = torch.full_like(logits, -1e9); logits[half] = 0.0  # the last token kept: half a character
        return logits
    got = {}
    for kind in (RequestOutputKind.CUMULATIVE, RequestOutputKind.FINAL_ONLY):
        eng = LLMEngine(num_gpu_blocks=64, async_scheduling=async_scheduling)
        eng.add_request(shared['prompts'][0], SamplingParams(temperature=0, max_tokens=12, logits_processors=[boom], output_kind=kind), 'r')
        last = None
        while eng.has_unfinished_requests():
            for o in eng.step(): last = o
        assert last.finished and isinstance(last.error, ZeroDivisionError) and last.outputs[0].finish_reason == 'abort'
        got[kind] = (last.outputs[0].text, last.outputs[0].token_ids)
        assert eng.block_manager.num_free_blocks == eng.num_gpu_blocks and not eng.detoks
    assert got[RequestOutputKind.FINAL_ONLY] == got[RequestOutputKind.CUMULATIVE] and len(got[RequestOutputKind.CUMULATIVE][1]) == 7
    assert got[RequestOutputKind.CUMULATIVE][1][-1] == half
    assert got[RequestOutputKind.CUMULATIVE][0]


def test_async_step_that_raises_with_a_step_in_flight_loses_nothing(shared):
    """A batch that fails as a whole (each request alone is fine: no culprit, so the error goes up) while the step
    before is in flight: that step is still finished, the request it completes gets its final output (from the next
    call), the others carry on exactly as alone, and the pool comes back all free."""
    p, eng = shared['prompts'], LLMEngine(num_gpu_blocks=64, async_scheduling=True)
    solo = [run_all(LLMEngine(num_gpu_blocks=64, async_scheduling=True), [(p[i], SamplingParams(temperature=0, max_tokens=n))])[0][0].outputs[0].token_ids
            for i, n in ((0, 3), (1, 10), (2, 10))]
    ids = [eng.add_request(p[i], SamplingParams(temperature=0, max_tokens=n)) for i, n in ((0, 3), (1, 10), (2, 10))]
    orig, armed = eng.runner.launch, []

    def launch(seqs, n, tables, prev=None, num_steps=None):
        if armed and len(seqs) > 1: armed.clear(); raise RuntimeError('the whole batch fails (out of memory, say)')
        return orig(seqs, n, tables, prev, num_steps)
    eng.runner.launch = launch
    short = eng.groups[ids[0]].seqs[0]
    done, raised = {}, 0
    while eng.has_unfinished_requests() or eng.undelivered:
        if short.num_output_tokens == 2 and short.num_pending_tokens == 1 and not raised: armed.append(True)  # its last token is in flight
        try: outs = eng.step()
        except RuntimeError: raised += 1; continue
        for o in outs:
            if o.finished: done[o.request_id] = o
    assert raised == 1 and set(done) == set(ids)
    assert [done[i].outputs[0].token_ids for i in ids] == solo and len(solo[0]) == 3
    assert eng.block_manager.num_free_blocks == eng.num_gpu_blocks and not eng.detoks and eng.inflight is None


@pytest.mark.parametrize('async_scheduling', [False, True], ids=['sync', 'async'])
def test_min_tokens_boundary_with_a_pending_token(shared, async_scheduling):
    """A stop token that greedy decoding picks exactly at index min_tokens: allowed there, so the request stops with
    min_tokens + 1 tokens. With async scheduling the step that samples it still has the token before on the device;
    counting only the host's tokens would forbid the stop token one step too long."""
    p = shared['prompts'][1]
    free = run_all(LLMEngine(num_gpu_blocks=64, async_scheduling=False), [(p, SamplingParams(temperature=0, max_tokens=12))])[0][0].outputs[0].token_ids
    m = next(i for i in range(3, 12) if free[i] not in free[:i])
    params = SamplingParams(temperature=0, min_tokens=m, stop_token_ids=[free[m]], max_tokens=20)
    out = run_all(LLMEngine(num_gpu_blocks=64, async_scheduling=async_scheduling), [(p, params)])[0][0].outputs[0]
    assert out.finish_reason == 'stop' and out.stop_reason == free[m] and out.token_ids == free[:m + 1]


@ASYNC
def test_a_steady_sampling_batch_changes_nothing(shared, async_scheduling):
    """The runner's last sampling batch, reused (rows dropped as requests finish), samples what a batch built anew would:
    greedy, unseeded and seeded sampling, top-k/top-p/min-p, logit bias and logprobs, with a penalty request and a
    min_tokens request making the batch depend on the outputs for a while."""
    p = shared['prompts']
    kinds = [SamplingParams(temperature=0, max_tokens=30), SamplingParams(temperature=1.5, top_k=1, max_tokens=26),
             SamplingParams(temperature=0.9, seed=7, max_tokens=22, logprobs=2), SamplingParams(temperature=1.5, min_p=0.95, max_tokens=18),
             SamplingParams(temperature=0, logit_bias={13: 5.0}, max_tokens=14), SamplingParams(temperature=1.1, top_p=0.8, seed=1, max_tokens=10),
             SamplingParams(temperature=0.5, repetition_penalty=1.3, max_tokens=6), SamplingParams(temperature=0, min_tokens=4, max_tokens=8)]
    reqs = [(p[i % len(p)], k) for i, k in enumerate(kinds)]
    results, counts = [], []
    for reuse in (True, False):
        eng = LLMEngine(num_gpu_blocks=64, async_scheduling=async_scheduling, seed=5)
        r, built, n = eng.runner, eng.runner.sampling_batch, {'kept': 0, 'steps': 0}
        def sampling_batch(sampled, r=r, built=built, n=n, reuse=reuse):
            if not reuse: r.last_sampling = None  # always built anew
            n['kept'] += r.last_sampling is not None and rows_kept(r.last_sampling[0], sampled) is not None
            n['steps'] += 1
            return built(sampled)
        r.sampling_batch = sampling_batch
        out, _ = run_all(eng, reqs)
        assert r.last_sampling is None  # an idle engine keeps no batch (nor its sequences) alive
        results.append([summary(o) for o in out]); counts.append(n)
    assert results[0] == results[1]
    assert counts[0]['kept'] > counts[0]['steps'] // 2 and counts[1]['kept'] == 0, counts


# Multi-step scheduling (chapters 12, 11, 13): a step of decodes alone runs several times in one launch, each step fed
# the one before's tokens on the device; the engine appends them afterwards. The outputs are those of one step at a time.

def spy_steps(eng):
    """Record every launch's num_steps (None: one step)."""
    launches, orig = [], eng.runner.launch
    def launch(seqs, n, tables, prev=None, num_steps=None):
        launches.append(num_steps)
        return orig(seqs, n, tables, prev, num_steps)
    eng.runner.launch = launch
    return launches


@ASYNC
@pytest.mark.parametrize('case', ['mixed', 'recompute', 'swap', 'prefix'])
def test_multi_step_matches_hf(shared, case, async_scheduling):
    kw = dict(num_gpu_blocks=14, num_cpu_blocks=64, preemption_mode=case) if case in ('recompute', 'swap') else dict(num_gpu_blocks=128)
    eng = LLMEngine(async_scheduling=async_scheduling, num_scheduler_steps=4, **kw)
    launches = spy_steps(eng)
    if case == 'prefix': assert run(eng, shared['shared_prefix'], GREEDY, stagger=True) == shared['shared_refs']
    else: assert run(eng, shared['prompts'], GREEDY) == shared['refs']
    multi = [k for k in launches if k is not None]
    assert len(multi) > 3 and max(map(max, multi)) == 4, 'decodes ran four steps per launch'
    if case in ('recompute', 'swap'): assert eng.scheduler.num_preemptions > 0


@ASYNC
def test_multi_step_matches_one_step_on_stops_seeds_and_logprobs(shared, async_scheduling):
    """eos, stop strings, stop token ids, max_tokens (sequences that end inside a launch), min_tokens (which shortens a
    launch), logprobs and seeded sampling: the outputs of one step at a time."""
    p = shared['prompts']
    kinds = [SamplingParams(temperature=0, max_tokens=40), SamplingParams(temperature=0, stop=[' the', '.'], max_tokens=30),
             SamplingParams(temperature=0, stop_token_ids=[13], max_tokens=30, logprobs=3),
             SamplingParams(temperature=0.9, seed=7, max_tokens=25), SamplingParams(temperature=0, max_tokens=5),
             SamplingParams(temperature=0, min_tokens=12, max_tokens=20), SamplingParams(temperature=0.7, top_p=0.9, seed=3, max_tokens=18, logprobs=1),
             SamplingParams(temperature=0, max_tokens=1), SamplingParams(temperature=0, logit_bias={13: 3.0}, max_tokens=17)]
    reqs = [(p[i % len(p)], k) for i, k in enumerate(kinds)]
    one, _ = run_all(LLMEngine(num_gpu_blocks=64, async_scheduling=async_scheduling), reqs)
    eng = LLMEngine(num_gpu_blocks=64, async_scheduling=async_scheduling, num_scheduler_steps=5)
    launches = spy_steps(eng)
    many, _ = run_all(eng, reqs)
    multi = [k for k in launches if k is not None]
    assert len(multi) >= 5 and any(len(set(k)) > 1 for k in multi), 'multi-step launches, some with a sequence ending inside'
    for a, b in zip(one, many):
        (ta, xa, fa, ra, la), = summary(a); (tb, xb, fb, rb, lb), = summary(b)
        assert (ta, xa, fa, ra) == (tb, xb, fb, rb)
        if la is not None: assert all(d1.keys() == d2.keys() and all(abs(d1[k] - d2[k]) < 1e-4 for k in d1) for d1, d2 in zip(la, lb))
    assert {o.outputs[0].finish_reason for o in many} == {'stop', 'length'} and not eng.detoks


def test_multi_step_abort_while_a_launch_is_in_flight(shared):
    p, params = shared['prompts'], SamplingParams(temperature=0, max_tokens=20)
    alone = [run_all(LLMEngine(num_gpu_blocks=64), [(q, params)])[0][0].outputs[0].token_ids for q in p[:3]]
    eng = LLMEngine(num_gpu_blocks=64, async_scheduling=True, num_scheduler_steps=4)
    ids = [eng.add_request(q, params) for q in p[:3]]
    done = {}
    while eng.inflight is None or not any(s.num_pending_tokens > 1 for g in eng.scheduler.running for s in g.seqs): eng.step()
    assert eng.abort(ids[1]) and eng.inflight is not None  # several of its tokens are still on the device
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished: done[o.request_id] = o
    assert ids[1] not in done and [done[ids[0]].outputs[0].token_ids, done[ids[2]].outputs[0].token_ids] == [alone[0], alone[2]]
    assert eng.block_manager.num_free_blocks == eng.num_gpu_blocks and not eng.detoks


def test_num_scheduler_steps_is_checked():
    from paged_infer.core.config import EngineConfigError
    for bad in (0, -1, 2.5):
        with pytest.raises(EngineConfigError): EngineConfig(num_scheduler_steps=bad)


WIDE = {'n': lambda k, m: SamplingParams(n=k, temperature=1.0, seed=3, max_tokens=m, ignore_eos=True),
        'best_of': lambda k, m: SamplingParams(best_of=k, n=1, temperature=1.0, seed=3, max_tokens=m, ignore_eos=True),
        'beam': lambda k, m: SamplingParams(use_beam_search=True, best_of=k, n=k, temperature=0, max_tokens=m, ignore_eos=True)}


@pytest.mark.parametrize('mode', ['recompute', 'swap'])
def test_a_request_that_might_outgrow_the_pool_is_refused_up_front(shared, mode):
    """A pool of 8 blocks of 16 tokens: n, best_of and beams whose sequences, each prompt plus max_tokens long, would
    need more are refused with the limit named (never cut short with 'length'); those that fit get every token, though
    a greedy request beside them forces preemptions; the greedy one gets HF's tokens; nothing leaks."""
    eng = LLMEngine(num_gpu_blocks=8, num_cpu_blocks=16, preemption_mode=mode)
    p = shared['prompts'][0]
    assert eng.max_model_len == 128 and 2 * (len(p) + 32) > 128, 'the pool sets the model length; two answers do not fit'
    for kind, k, param in [('n', 3, 'n'), ('n', 4, 'n'), ('n', 8, 'n'), ('best_of', 8, 'best_of'), ('beam', 4, 'best_of')]:
        with pytest.raises(RequestError, match=f'{param}={k} sequences .* KV cache holds 8') as e:
            eng.add_request(p, WIDE[kind](k, 32))
        assert e.value.param == param
    assert not eng.groups and eng.block_manager.num_free_blocks == 8
    fits = 128 // 2 - len(p)  # two sequences of prompt plus this many tokens: 4 blocks each
    for kind in WIDE:
        a = eng.add_request(shared['prompts'][1], GREEDY)
        b = eng.add_request(p, WIDE[kind](2, fits))
        done, steps = {}, 0
        while eng.has_unfinished_requests():
            for o in eng.step():
                if o.finished: done[o.request_id] = o
            eng.block_manager.check_invariants(); steps += 1
            assert steps < 1000, 'no progress'
        assert done[a].outputs[0].token_ids == shared['refs'][1]
        assert [(len(c.token_ids), c.finish_reason) for c in done[b].outputs] == [(fits, 'length')] * len(done[b].outputs)
        assert eng.block_manager.num_free_blocks == 8 and eng.block_manager.cpu.num_free == 16 and not eng.detoks
    assert eng.scheduler.num_preemptions > 0
    for params, param in [(SamplingParams(n=300, temperature=1.0), 'n'), (SamplingParams(best_of=300, temperature=1.0), 'best_of')]:
        with pytest.raises(RequestError, match='max_num_seqs') as e: eng.add_request('Hello', params)  # could never run
        assert e.value.param == param


@pytest.mark.parametrize('mode,blocks,prompt,out,first', [('swap', 4, 16, 16, (14, 10)), ('recompute', 16, 96, 30, (100, 20))])
def test_a_request_that_fits_alone_is_not_cut_short_after_a_preemption(mode, blocks, prompt, out, first):
    """n = 2 that fits the pool, preempted once by an older request: it still gets all its tokens (swap: 2 x 2 blocks
    of 16, where swap-in once asked a block per sequence it did not need; recompute: 2 x 8, readmitted after the
    older request's 8 blocks made it preempt itself)."""
    eng = LLMEngine(num_gpu_blocks=blocks, num_cpu_blocks=64, preemption_mode=mode)
    a = eng.add_request(list(range(1000, 1000 + first[0])), SamplingParams(temperature=0, max_tokens=first[1], ignore_eos=True))
    g = eng.add_request(list(range(2000, 2000 + prompt)), SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=out, ignore_eos=True))
    done = {}
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished: done[o.request_id] = o
    assert eng.scheduler.num_preemptions > 0
    assert [len(c.token_ids) for c in done[g].outputs] == [out, out] and len(done[a].outputs[0].token_ids) == first[1]
    assert eng.block_manager.num_free_blocks == blocks


def test_a_single_sequence_swapped_at_its_last_block_comes_back():
    """A request sized to the pool less the watermark (99 of 100 blocks), swapped out by a more urgent request just
    before its last block: it comes back and ends at max_tokens (swap-in counts a block for the next token only where
    the last block is full)."""
    eng = LLMEngine(num_gpu_blocks=100, num_cpu_blocks=128, preemption_mode='swap', policy='priority')
    bm = eng.block_manager
    assert bm.watermark_blocks == 1
    s = eng.add_request(list(range(1000, 2500)), SamplingParams(temperature=0, max_tokens=84, ignore_eos=True))  # 99 blocks
    done, t = {}, None
    while eng.has_unfinished_requests():
        q = eng.groups[s].seqs[0].seq_id if s in eng.groups else None
        if t is None and q in bm.tables and bm.tables[q].num_tokens >= 98 * 16 - 5:
            t = eng.add_request(list(range(3000, 3002)), SamplingParams(temperature=0, max_tokens=40, ignore_eos=True), priority=-1)
        for o in eng.step():
            if o.finished: done[o.request_id] = o
    assert eng.scheduler.num_preemptions == 1
    assert [len(done[r].outputs[0].token_ids) for r in (s, t)] == [84, 40] and bm.num_free_blocks == 100


@pytest.fixture(scope='module')
def one_model():
    "The default model loaded once for the engines of a property test (each example builds its own pool)."
    import paged_infer.core.engine as engine_module
    load, cache = engine_module.load_model, {}

    def cached(*args, **kwargs):
        key = (args, tuple(sorted(kwargs.items())))
        if key not in cache:
            cache[key] = load(*args, **kwargs)
        return cache[key]
    engine_module.load_model = cached
    yield
    engine_module.load_model = load


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_every_answer_is_whole_or_refused(one_model, data):
    """Random pools (48-192 tokens in blocks of 4, 8 or 16, swap space or none, either preemption mode, prefix caching on
    or off) and random requests (greedy, n, best_of, beams, stop strings): each request is refused up front with the
    limit named, or every choice it returns reached its max_tokens or a stop; none is ever cut short."""
    bs = data.draw(st.sampled_from([4, 8, 16]))
    eng = LLMEngine(num_gpu_blocks=data.draw(st.integers(3, 12)) * 16 // bs, block_size=bs,
                    num_cpu_blocks=data.draw(st.sampled_from([0, 8, 32])), preemption_mode=data.draw(st.sampled_from(['recompute', 'swap'])),
                    enable_prefix_caching=data.draw(st.booleans()), max_num_batched_tokens=data.draw(st.sampled_from([32, 128])))
    kinds = [lambda m: SamplingParams(temperature=0, max_tokens=m), lambda m: SamplingParams(temperature=0, max_tokens=m, ignore_eos=True),
             lambda m: SamplingParams(n=data.draw(st.integers(2, 4)), temperature=1.0, seed=1, max_tokens=m),
             lambda m: SamplingParams(best_of=3, n=2, temperature=0.8, seed=2, max_tokens=m, ignore_eos=True),
             lambda m: SamplingParams(use_beam_search=True, best_of=data.draw(st.integers(2, 3)), temperature=0, max_tokens=m),
             lambda m: SamplingParams(temperature=0.7, seed=3, stop=[' the', '.'], max_tokens=m)]
    asked = {}
    for _ in range(data.draw(st.integers(1, 5))):
        prompt = data.draw(st.lists(st.integers(100, 40000), min_size=1, max_size=40))
        params = data.draw(st.sampled_from(kinds))(data.draw(st.integers(6, 24)))
        try:
            asked[eng.add_request(prompt, params)] = params
        except RequestError as e:
            assert e.param in ('n', 'best_of', 'max_tokens') and ('KV cache' in str(e) or 'context length' in str(e))
    done, steps = {}, 0
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished: done[o.request_id] = o
        steps += 1
        assert steps < 2000, 'no progress'
    assert done.keys() == asked.keys()
    for rid, o in done.items():
        assert len(o.outputs) == asked[rid].n
        for c in o.outputs:
            assert c.finish_reason == 'stop' or (c.finish_reason == 'length' and len(c.token_ids) == asked[rid].max_tokens), (asked[rid], c)
    assert eng.block_manager.num_free_blocks == eng.num_gpu_blocks and not eng.detoks


def test_max_model_len_fits_the_pool():
    """A pool smaller than the model's length: the model's default length is lowered to the pool (8 blocks of 16
    tokens), a length asked for that does not fit stops the engine from starting."""
    assert LLMEngine(num_gpu_blocks=8).max_model_len == 128
    assert LLMEngine(num_gpu_blocks=8, max_model_len=100).max_model_len == 100
    with pytest.raises(EngineConfigError, match='max_model_len 256 does not fit the KV cache'):
        LLMEngine(num_gpu_blocks=8, max_model_len=256)


def test_an_embedding_prompt_may_fill_the_context():
    """An embedding request's sampled token is never stored, so its prompt may be max_model_len tokens long (as vLLM's
    may): it is embedded as transformers embeds it, the pool is all free after; one token more is a RequestError."""
    llm = LLM(num_gpu_blocks=16, max_model_len=64)
    ids = list(range(100, 164))
    vec = torch.tensor(llm.embed({'prompt_token_ids': ids}, use_tqdm=False)[0].outputs.embedding)
    hf = AutoModelForCausalLM.from_pretrained(prepare_default_model(), dtype=torch.float32).eval()
    with torch.no_grad():
        ref = torch.nn.functional.normalize(hf.model(torch.tensor([ids])).last_hidden_state[0, -1], dim=0)
    assert (vec - ref).abs().max() < 1e-5
    assert llm.engine.block_manager.num_free_blocks == 16
    with pytest.raises(RequestError, match='maximum context length is 64'):
        llm.embed({'prompt_token_ids': ids + [5]}, use_tqdm=False)
    assert llm.engine.block_manager.num_free_blocks == 16 and not llm.engine.has_unfinished_requests()


def test_dummy_load_format_makes_random_weights_of_the_config():
    """vLLM's load_format='dummy': the default model's shape with seeded noise in [-1e-3, 1e-3] in place of its weights
    (tied embeddings stay tied); the engine serves it; an unknown format is refused."""
    eng = LLMEngine(num_gpu_blocks=16, load_format='dummy')
    real = LLMEngine(num_gpu_blocks=16)
    params = dict(eng.model.named_parameters())
    assert params.keys() == dict(real.model.named_parameters()).keys()
    assert all(p.abs().max() <= 1e-3 for p in params.values())
    assert not torch.equal(eng.model.model.embed_tokens.weight, real.model.model.embed_tokens.weight)
    loaded, _ = load_model(load_format='dummy')  # as loaded: the engine on a CPU packs its LM head (chapter 11c)
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    eng.add_request(list(range(100, 120)), SamplingParams(max_tokens=6, ignore_eos=True))
    done = []
    while eng.has_unfinished_requests():
        done += [o for o in eng.step() if o.finished]
    assert len(done[0].outputs[0].token_ids) == 6 and eng.block_manager.num_free_blocks == 16
    with pytest.raises(EngineConfigError, match="'auto' or 'dummy'"):
        EngineConfig(load_format='npz')


def test_load_format_flags_reach_the_engine_config(tmp_path, capsys):
    """`serve --load-format dummy` and `bench ... --shape S --load-format dummy` build a dummy EngineConfig; the bench
    writes the shape's config and tokenizer only (no weights); Hugging Face side by side is refused (no checkpoint)."""
    from paged_infer.bench.cli import engine_config_from_args
    from paged_infer.entrypoints.cli import build_parser, engine_config, main

    p = build_parser()
    assert engine_config(p.parse_args(['serve', '--load-format', 'dummy'])).load_format == 'dummy'
    assert engine_config(p.parse_args(['serve'])).load_format == 'auto'
    args = p.parse_args(['bench', 'throughput', '--shape', 'smollm2-135m', '--load-format', 'dummy',
                         '--model-dir', str(tmp_path / 'm')])
    config = engine_config_from_args(args)
    assert config.load_format == 'dummy' and (tmp_path / 'm' / 'config.json').is_file()
    assert not list((tmp_path / 'm').glob('*.safetensors'))
    assert main(['bench', 'throughput', '--shape', 'smollm2-135m', '--load-format', 'dummy', '--backend', 'hf',
                 '--model-dir', str(tmp_path / 'm')]) != 0
    assert 'no checkpoint for Hugging Face' in capsys.readouterr().err


def test_forks_sharing_a_partly_filled_block_come_back_from_swap():
    """Three forks of a one-token prompt share its block. Swapped out, they come back needing two copies, not three
    (the last to write finds the block its own again): in a pool of exactly three blocks every choice gets all its
    tokens, where an over-count cut the request as one that could never fit again (found by the property test above)."""
    eng = LLMEngine(num_gpu_blocks=3, block_size=16, num_cpu_blocks=8, preemption_mode='swap',
                    enable_prefix_caching=False, max_num_batched_tokens=32)
    rid = eng.add_request([100], SamplingParams(n=3, temperature=1.0, seed=1, max_tokens=6))
    done = {}
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished:
                done[o.request_id] = o
    assert eng.scheduler.num_preemptions > 0, 'the pool was meant to be too small for the first step of the forks'
    assert [(c.finish_reason, len(c.token_ids)) for c in done[rid].outputs] == [('length', 6)] * 3
    assert eng.block_manager.num_free_blocks == 3
