"""Speculative decoding (chapter 13d) changes how many steps a request takes, never what it says.

Greedy output is token-identical to Hugging Face transformers with n-gram drafts, under preemption (recompute, swap),
chunked prefill and prefix-cache hits; stop strings, `max_tokens`, logprobs and `n > 1` come out as without drafts;
under sampling the tokens keep the model's distribution (a chi-square test that fails for a wrong acceptance rule);
nothing leaks. Every test also checks that drafts were made and accepted, so that none passes with speculation idle.
"""
import dataclasses
import json
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from paged_infer.bench.workloads import TOKENIZER_FILES
from paged_infer.core.config import EngineConfigError, SpeculativeConfig
from paged_infer.core.engine import LLMEngine
from paged_infer.core.sampling_params import SamplingParams
from paged_infer.core.spec_decode import SpeculativeDecoding, Speculator
from paged_infer.entrypoints.llm import LLM
from paged_infer.model.default_model import prepare_default_model
from paged_infer.ops import sampler

N_NEW = 32
PASSAGE = ('A paged KV cache keeps each sequence in blocks of sixteen tokens, and a block table maps the positions of '
           'a sequence to the blocks of one shared pool, so that no memory is reserved for tokens that never come.')
COPY = [f'Repeat this passage exactly, word for word:\n\n{PASSAGE}',
        'Copy this list as it is:\n1. apples\n2. pears\n3. plums\n4. cherries\n5. grapes']
OTHER = ['What is the capital of France?', 'Write a short haiku about memory and forgetting, please.']
SYSTEM = 'You are a careful copy editor. When asked to repeat a text, you repeat it exactly and add nothing else.'
NGRAM = {'method': 'ngram', 'num_speculative_tokens': 4, 'prompt_lookup_max': 3, 'prompt_lookup_min': 1,
         'disable_when_slower': False}  # (drafts in every step that can: the tests are of the drafting path)


@pytest.fixture(scope='module')
def shared():
    "The tokenizer, chat prompts (copy-heavy and not) and Hugging Face's greedy references, computed once."
    hf = AutoModelForCausalLM.from_pretrained(prepare_default_model(), dtype=torch.float32).eval()
    tok = LLMEngine(num_gpu_blocks=8).tokenizer
    chat = lambda q, sys=None: tok.apply_chat_template(([{'role': 'system', 'content': sys}] if sys else []) +
                                                       [{'role': 'user', 'content': q}], add_generation_prompt=True,
                                                       tokenize=True, return_dict=False)

    def ref(p):
        out = hf.generate(torch.tensor([p]), max_new_tokens=N_NEW, do_sample=False, pad_token_id=tok.eos_token_id)
        new = out[0, len(p):].tolist()
        return new[: new.index(tok.eos_token_id) + 1] if tok.eos_token_id in new else new

    prompts = [chat(q) for q in COPY + OTHER]
    prefixed = [chat(q, SYSTEM) for q in COPY + OTHER]
    return dict(tok=tok, prompts=prompts, refs=[ref(p) for p in prompts], prefixed=prefixed,
                prefixed_refs=[ref(p) for p in prefixed])


def run(engine, prompts, params, stagger=False) -> list:
    "Every request's RequestOutput when finished; the pool checked after every step and whole at the end."
    ids = []
    for i, p in enumerate(prompts):
        ids.append(engine.add_request(p, params))
        if stagger and i == 0:  # the first prompt is computed (and cached) before the others arrive
            engine.step()
    done = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                done[o.request_id] = o
        engine.block_manager.check_invariants()
    bm = engine.block_manager
    assert bm.num_free_blocks == engine.num_gpu_blocks and bm.cpu.num_free == bm.cpu.num_blocks, 'blocks leaked'
    return [done[r] for r in ids]


def accepted(engine) -> int:
    return engine.stats().spec_decode['num_accepted_tokens']


GREEDY = SamplingParams(temperature=0, max_tokens=N_NEW)  # (no min_tokens: its mask turns drafts off)
CASES = {  # engine settings under which speculation must not change a token
    'mixed': dict(num_gpu_blocks=128),
    'recompute': dict(num_gpu_blocks=14, preemption_mode='recompute'),
    'swap': dict(num_gpu_blocks=14, preemption_mode='swap', num_cpu_blocks=64),
    'chunked': dict(num_gpu_blocks=128, enable_chunked_prefill=True, max_num_batched_tokens=24),
}


@pytest.mark.parametrize('case', list(CASES))
def test_greedy_matches_hf(shared, case):
    eng = LLMEngine(speculative_config=NGRAM, **CASES[case])
    outs = run(eng, shared['prompts'], GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == shared['refs']
    assert accepted(eng) > 0
    if case in ('recompute', 'swap'):
        assert eng.scheduler.num_preemptions > 0, 'the pool was meant to be too small'


def test_greedy_with_prefix_cache_hits(shared):
    eng = LLMEngine(num_gpu_blocks=128, enable_prefix_caching=True, speculative_config=NGRAM)
    outs = run(eng, shared['prefixed'], GREEDY, stagger=True)
    assert [o.outputs[0].token_ids for o in outs] == shared['prefixed_refs']
    assert eng.block_manager.prefix_hits > 0 and accepted(eng) > 0


def test_drafts_are_verified_as_decode_rows(shared):
    "A step of decodes with drafts is a step of one-token rows: CUDA graphs can replay it (chapter 11a)."
    eng = LLMEngine(num_gpu_blocks=64, speculative_config=NGRAM)
    lens = []
    launch = eng.runner.launch_batch

    def spy(host, sampled, *a, **kw):
        lens.append(list(host.query_lens))
        return launch(host, sampled, *a, **kw)

    eng.runner.launch_batch = spy
    run(eng, shared['prompts'][:1], GREEDY)
    assert any(len(q) > 1 and set(q) == {1} for q in lens), 'no decode step carried a draft'


def test_drafts_never_pass_max_tokens(shared):
    params = SamplingParams(temperature=0, max_tokens=7)
    eng = LLMEngine(num_gpu_blocks=64, speculative_config=dict(NGRAM, num_speculative_tokens=6))
    (o,) = run(eng, shared['prompts'][:1], params)
    assert o.outputs[0].token_ids == shared['refs'][0][:7] and o.outputs[0].finish_reason == 'length'
    assert accepted(eng) > 0


def summary(o) -> list:
    return [(c.token_ids, c.text, c.finish_reason, c.stop_reason, c.cumulative_logprob) for c in o.outputs]


@pytest.mark.parametrize('kind', ['stop', 'logprobs'])
def test_stop_strings_and_logprobs_as_without_drafts(shared, kind):
    tok = shared['tok']
    word = tok.decode(shared['refs'][0][12:16]).strip().split()[0]  # a word the copy says after its start
    params = {'stop': SamplingParams(temperature=0, max_tokens=N_NEW, stop=[word]),
              'logprobs': SamplingParams(temperature=0, max_tokens=N_NEW, logprobs=3)}[kind]
    plain = run(LLMEngine(num_gpu_blocks=128), shared['prompts'], params)
    eng = LLMEngine(num_gpu_blocks=128, speculative_config=NGRAM)
    fast = run(eng, shared['prompts'], params)
    assert accepted(eng) > 0
    for a, b in zip(plain, fast):
        (ta, xa, fa, sa, la), (tb, xb, fb, sb, lb) = summary(a)[0], summary(b)[0]
        assert (ta, xa, fa, sa) == (tb, xb, fb, sb)
        if kind == 'logprobs':
            assert lb == pytest.approx(la, abs=1e-3)
            for pa, pb in zip(a.outputs[0].logprobs, b.outputs[0].logprobs):
                assert pa.keys() == pb.keys()
    if kind == 'stop':
        assert plain[0].outputs[0].finish_reason == 'stop' and plain[0].outputs[0].stop_reason == word


def test_parallel_sampling_drafts_for_each_sequence(shared):
    params = SamplingParams(n=3, temperature=0.3, max_tokens=N_NEW, seed=7)
    eng = LLMEngine(num_gpu_blocks=128, speculative_config=NGRAM)
    (o,) = run(eng, shared['prompts'][:1], params)
    assert len(o.outputs) == 3 and all(len(c.token_ids) == N_NEW for c in o.outputs)
    assert eng.stats().spec_decode['num_drafts'] >= 3 and accepted(eng) > 0


def test_disable_by_batch_size_turns_drafts_off(shared):
    eng = LLMEngine(num_gpu_blocks=128, speculative_config=dict(NGRAM, disable_by_batch_size=2))
    outs = run(eng, shared['prompts'], GREEDY)  # four at once: no drafts until two are left
    assert [o.outputs[0].token_ids for o in outs] == shared['refs']
    eng2 = LLMEngine(num_gpu_blocks=128, speculative_config=dict(NGRAM, disable_by_batch_size=1))
    run(eng2, shared['prompts'][:1], GREEDY)
    assert eng2.stats().spec_decode['num_drafts'] == 0


def test_llm_takes_vllms_speculative_config(shared):
    llm = LLM(num_gpu_blocks=64, speculative_config=NGRAM)
    (out,) = llm.generate([{'prompt_token_ids': shared['prompts'][0]}], GREEDY, use_tqdm=False)
    assert out.outputs[0].token_ids == shared['refs'][0]
    assert llm.engine.stats().spec_decode['num_accepted_tokens'] > 0


@pytest.mark.parametrize('bad,words', [
    ({'method': 'eagle', 'num_speculative_tokens': 3}, 'not supported'),
    ({'method': 'ngram'}, 'num_speculative_tokens'),
    ({'method': 'ngram', 'num_speculative_tokens': 0}, '>= 1'),
    ({'method': 'ngram', 'num_speculative_tokens': 2, 'prompt_lookup_min': 3, 'prompt_lookup_max': 2}, 'min <= max'),
    ({'method': 'ngram', 'num_speculative_tokens': 2, 'lookahead': 1}, 'unknown key'),
    ({'model': 'a-draft', 'num_speculative_tokens': 2, 'quantization': 'int3'}, "'int3': one of"),
    ('{"method": "ngram", ', 'not valid JSON'),
])
def test_a_bad_speculative_config_is_named(bad, words):
    with pytest.raises(EngineConfigError, match=words):
        SpeculativeConfig.parse(bad)


# --- under sampling: the tokens keep the model's distribution ---------------------------------------------------------

V = 24  # a small vocabulary: every token's count is large enough for a chi-square test


@pytest.fixture(scope='module')
def tiny(tmp_path_factory):
    """A random Llama of 24 tokens with peaked next-token distributions (the default model's tokenizer files beside
    it), and a prompt of its own greedy continuation: n-gram drafts from it are often, not always, accepted."""
    folder = tmp_path_factory.mktemp('tiny')
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.6, bos_token_id=1,
                      eos_token_id=2, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # attention turned down: nearly a Markov chain, whose n-gram drafts are often right
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(0.2)
    model.save_pretrained(folder)
    for name in TOKENIZER_FILES:
        if (prepare_default_model() / name).is_file():
            shutil.copy(prepare_default_model() / name, folder / name)
    start = torch.tensor([[7 * i % V for i in range(V)]])  # every token once: each has an n-gram to follow
    prompt = model.generate(start, max_new_tokens=24, do_sample=False, pad_token_id=0)[0].tolist()
    return folder, prompt


def token_counts(tiny, speculative_config, num=1500, seed=0) -> tuple:
    """How often each token is the 3rd and 4th of `num` sampled answers: with drafts, those are tokens of verified
    steps (the 1st comes from the prefill, the 2nd is the first draft's input)."""
    folder, prompt = tiny
    eng = LLMEngine(model=str(folder), num_gpu_blocks=1024, max_num_seqs=128, max_num_batched_tokens=4096,
                    speculative_config=speculative_config, seed=seed)
    params = SamplingParams(temperature=1.0, max_tokens=4, ignore_eos=True)
    outs = run(eng, [prompt] * num, params)
    counts = torch.zeros(2, V, dtype=torch.float64)
    for o in outs:
        t = o.outputs[0].token_ids
        counts[0, t[2]] += 1
        counts[1, t[3]] += 1
    return counts, eng


def chi_square_p(a: torch.Tensor, b: torch.Tensor) -> float:
    "p-value of the chi-square test that two count vectors come from one distribution (bins with counts only)."
    keep = (a + b) > 0
    table = torch.stack([a[keep], b[keep]])  # (2, bins)
    expected = table.sum(1, keepdim=True) * table.sum(0, keepdim=True) / table.sum()
    x = ((table - expected) ** 2 / expected).sum()
    df = torch.tensor((keep.sum().item() - 1) / 2, dtype=torch.float64)
    return torch.special.gammaincc(df, x / 2).item()


def always_accept_first(self, s, draft, samples, i):
    "A wrong acceptance rule: the first draft token is taken whatever the model sampled there."
    tokens = samples.token_ids.clone()
    tokens[i] = draft[0]
    return ACCEPT(self, s, draft, dataclasses.replace(samples, token_ids=tokens), i)


ACCEPT = SpeculativeDecoding._accept


def test_sampling_keeps_the_models_distribution(tiny, monkeypatch):
    spec = {'method': 'ngram', 'num_speculative_tokens': 3, 'prompt_lookup_max': 2, 'prompt_lookup_min': 1,
            'disable_when_slower': False}
    plain, _ = token_counts(tiny, None, seed=1)
    fast, eng = token_counts(tiny, spec, seed=2)
    c = eng.stats().spec_decode
    assert c['num_drafts'] >= 1200 and 0.05 < c['num_accepted_tokens'] / c['num_draft_tokens'] < 0.9
    for j in range(2):
        assert chi_square_p(plain[j], fast[j]) > 1e-3, f'token {j + 3}: speculation changed the distribution'
    monkeypatch.setattr(SpeculativeDecoding, '_accept', always_accept_first)
    wrong, _ = token_counts(tiny, spec, seed=3)
    assert chi_square_p(plain[0], wrong[0]) < 1e-6, 'the test cannot tell a wrong acceptance rule'


# --- through the server: the official client, and the counters on /metrics ------------------------------------------

def test_server_with_drafts_answers_as_without_and_counts_them():
    "A chat answer through the official client is the same with drafts; /metrics reports them in vLLM's names."
    import openai
    from prometheus_client.parser import text_string_to_metric_families
    import httpx

    from helpers import ServerThread
    from paged_infer.core.config import EngineConfig
    from paged_infer.entrypoints.async_engine import AsyncLLMEngine
    from paged_infer.entrypoints.server import build_app

    messages = [{'role': 'user', 'content': COPY[0]}]
    answers, counts = [], {}
    for spec in (None, NGRAM):
        config = EngineConfig(num_gpu_blocks=128, max_model_len=1024, max_num_seqs=8, speculative_config=spec)
        engine = AsyncLLMEngine.from_config(config, max_wait_ms=5)
        try:
            with ServerThread(build_app(engine, 'm')) as url:
                client = openai.OpenAI(base_url=url + '/v1', api_key='none')
                r = client.chat.completions.create(model='m', messages=messages, max_tokens=N_NEW, temperature=0)
                answers.append(r.choices[0].message.content)
                text = httpx.get(url + '/metrics', timeout=10).text
        finally:
            engine.shutdown()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith('paged_infer:spec_decode_'):
                counts[(s.name.removeprefix('paged_infer:spec_decode_'), s.labels.get('position'))] = s.value
    assert answers[0] == answers[1]
    drafts, drafted = counts[('num_drafts_total', None)], counts[('num_draft_tokens_total', None)]
    acc, emitted = counts[('num_accepted_tokens_total', None)], counts[('num_emitted_tokens_total', None)]
    assert 0 < acc <= drafted and acc < emitted <= acc + drafts  # a draft emits its accepted tokens and one (unless cut)
    assert counts[('draft_acceptance_rate', None)] == pytest.approx(acc / drafted)
    per_pos = [counts[('num_accepted_tokens_per_pos_total', str(j))] for j in range(NGRAM['num_speculative_tokens'])]
    assert sum(per_pos) == acc and per_pos == sorted(per_pos, reverse=True)


def test_drafting_pauses_while_it_is_slower_and_comes_back(shared):
    """Sampled open answers accept few draft tokens: drafting is measured slower and pauses, while drafts made aside
    keep the gain measured. Copies accept most: drafting comes back on its own, and the copies are HF's greedy tokens."""
    eng = LLMEngine(num_gpu_blocks=128, speculative_config=dict(NGRAM, prompt_lookup_min=2, disable_when_slower=True))
    steps = 0
    for p in shared['prompts'][2:]:
        for i in range(3):
            eng.add_request(p, SamplingParams(temperature=1.0, max_tokens=N_NEW, ignore_eos=True, seed=i))
    while eng.has_unfinished_requests():
        eng.step()
        steps += 1
    paused = eng.stats().spec_decode
    # (the gain of open answers: well under one token a step, where copies make several; how far under depends
    # on which steps drafted, which depends on measured times)
    assert paused['num_drafts'] < steps and eng.speculator.gain < 1.0, (paused, steps, eng.speculator.gain)
    outs = run(eng, shared['prompts'][:2], GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == shared['refs'][:2]
    came_back = eng.stats().spec_decode
    assert came_back['num_accepted_tokens'] - paused['num_accepted_tokens'] > N_NEW // 2, came_back


def test_the_pause_rules_bookkeeping():
    """The rule's pieces, without a model: a sequence drafted aside weighs 1/n of a step; a batch size borrows step
    times only from one next to it (batch 1 does not take batch 64's); drafting comes back from a pause only with
    `margin` to spare, and stays on without it; a gain under the margin does not try drafting, nor does no gain keep it
    on; drafting aside banks at most one step's share of credit."""
    sp = Speculator(SpeculativeConfig(num_speculative_tokens=4, prompt_lookup_max=4, prompt_lookup_min=2))
    sp.gain = 0.0
    sp.step_done(1, 4, of=64)
    assert sp.gain == pytest.approx(sp.smoothing * 4 / 64)
    sp.step_done(64, 64 * 4)  # a drafting step: full weight
    assert sp.gain == pytest.approx((1 - sp.smoothing) * sp.smoothing * 4 / 64 + sp.smoothing * 4)
    sp.seconds = ({1: 1.0, 6: 2.0, 7: 2.6}, {7: 8.0})
    assert sp._seconds(1) == (1.0, None)
    assert sp._seconds(40) == (2.6, 8.0) and sp._seconds(64) == (2.6, 8.0) and sp._seconds(200) == (2.6, 8.0)
    assert sp._seconds(1000) == (None, None)
    running = [dataclasses.make_dataclass('Group', ['seqs'])([]) for _ in range(64)]
    sp.gain = 8.0 / 2.6 - 1 + 0.05  # drafting promises 5% more tokens a second: not enough to come back
    sp.on = False
    assert not sp.active(running)
    sp.gain = 8.0 / 2.6 * 1.1 - 1 + 0.01
    assert sp.active(running)
    sp.gain = 8.0 / 2.6 - 1 + 0.05  # once on, it stays on while it wins at all
    assert sp.active(running)
    sp.seconds, sp.on, sp.gain = ({}, {}), False, sp.margin / 2  # nothing measured, a gain under the margin:
    assert not sp.active(running)  # a drafting step costs at least a plain one, so drafting is not even tried
    sp.gain = 2 * sp.margin
    assert sp.active(running)  # (a gain that could pay: drafting is tried first where nothing is measured)
    sp.seconds = ({7: 2.6}, {7: 2.0})  # drafting measured faster than plain: noise, it does more work
    sp.on, sp.gain = True, 0.0
    assert not sp.active(running)
    sp.on, sp.credit = False, 0.0
    for _ in range(100):
        sp._shadow_within(running, 2.6e-3)
    assert sp.credit <= sp.shadow_share * 2.6e-3


# --- a draft model (chapter 13e) ---------------------------------------------------------------------------------

DRAFT = {'model': str(prepare_default_model()), 'num_speculative_tokens': 4}  # the target as its own draft


@pytest.mark.parametrize('case', ['recompute', 'swap', 'chunked', 'prefix'])
def test_draft_model_keeps_hf_tokens_and_its_cache_in_step(shared, case):
    """HF's greedy tokens; and with the target as its own draft, (almost) every draft accepted: the draft's cache held
    the right keys and values through preemption, chunked prefill and prefix hits (a wrong one rejects drafts)."""
    kw = dict(CASES[case] if case in CASES else CASES['mixed'], enable_prefix_caching=True)
    if case in ('recompute', 'swap'):
        kw['num_gpu_blocks'] = 12  # (fewer steps than without drafts: a smaller pool preempts)
    prefixed = case == 'prefix'
    prompts, refs = (shared['prefixed'], shared['prefixed_refs']) if prefixed else (shared['prompts'], shared['refs'])
    eng = LLMEngine(speculative_config=DRAFT, **kw)
    outs = run(eng, prompts, GREEDY, stagger=case == 'prefix')
    assert [o.outputs[0].token_ids for o in outs] == refs
    c = eng.stats().spec_decode
    assert c['num_draft_tokens'] > 50 and c['num_accepted_tokens'] >= 0.95 * c['num_draft_tokens'], c
    assert not eng.drafter.computed
    if case in ('recompute', 'swap'):
        assert eng.scheduler.num_preemptions > 0
    if case == 'prefix':
        assert eng.block_manager.prefix_hits > 0


@pytest.mark.parametrize('mode', ['swap', 'recompute'])
def test_sampled_drafts_with_n_logprobs_and_stops_lose_nothing(shared, mode):
    """Sampled drafts of the target as its own draft, under preemption, with two answers a request, top logprobs and a
    stop string: every guess kept (q = p), each token's logprob reported, the pools whole; a seed gives its tokens
    again in a second engine."""
    params = SamplingParams(temperature=0.8, max_tokens=N_NEW, n=2, logprobs=2, stop=['\n\n'], seed=11)
    outs = []
    for _ in range(2):
        eng = LLMEngine(speculative_config=DRAFT, num_gpu_blocks=16, preemption_mode=mode, num_cpu_blocks=64)
        outs.append(run(eng, shared['prompts'], params))
        c = eng.stats().spec_decode
        assert c['num_draft_tokens'] > 50 and c['num_accepted_tokens'] >= 0.95 * c['num_draft_tokens'], c
        assert eng.scheduler.num_preemptions > 0 and not eng.drafter.computed
    for o in outs[0]:
        assert len(o.outputs) == 2
        for a in o.outputs:
            assert len(a.logprobs) == len(a.token_ids) and all(t in lp for t, lp in zip(a.token_ids, a.logprobs))
            assert '\n\n' not in a.text and (a.finish_reason == 'stop' or len(a.token_ids) == N_NEW)
    assert [[a.token_ids for a in o.outputs] for o in outs[0]] == [[a.token_ids for a in o.outputs] for o in outs[1]]


@pytest.fixture(scope='module')
def tiny_draft(tiny, tmp_path_factory):
    "Another random Llama of the tiny model's 24 tokens (another seed): a draft that is often wrong."
    folder = tmp_path_factory.mktemp('tiny_draft')
    torch.manual_seed(1)
    cfg = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=256, initializer_range=0.6, bos_token_id=1,
                      eos_token_id=2, tie_word_embeddings=False)
    LlamaForCausalLM(cfg).save_pretrained(folder)
    for name in TOKENIZER_FILES:
        if (tiny[0] / name).is_file():
            shutil.copy(tiny[0] / name, folder / name)
    return folder


def keep_every_guess(probs, sampled, guesses, generators, generator=None):
    "A wrong check: every sampled draft token kept, whatever the target's distribution says of it."
    rows = torch.tensor(guesses.rows, device=sampled.device)
    return sampled.index_copy(0, rows, guesses.tokens)


def test_draft_model_sampling_keeps_the_models_distribution(tiny, tiny_draft, monkeypatch):
    "Sampled drafts of another model, checked against the target's probabilities: the target's distribution."
    spec = {'model': str(tiny_draft), 'num_speculative_tokens': 3}
    plain, _ = token_counts(tiny, None, seed=1)
    fast, eng = token_counts(tiny, spec, seed=2)
    c = eng.stats().spec_decode
    assert c['num_drafts'] >= 1200 and 0 < c['num_accepted_tokens'] < c['num_draft_tokens'], c
    for j in range(2):
        assert chi_square_p(plain[j], fast[j]) > 1e-3, f'token {j + 3}: the draft model changed the distribution'
    monkeypatch.setattr(sampler, 'check_guesses', keep_every_guess)
    wrong, _ = token_counts(tiny, spec, num=500, seed=3)
    assert chi_square_p(plain[0], wrong[0]) < 1e-6, 'the test cannot tell a wrong check'


def test_a_model_as_its_own_sampled_draft_keeps_every_guess(tiny):
    """The target as its own draft, under sampling: q = p at every guess, so each is kept (min(1, p/q) = 1); drafts
    taken greedily and compared with the target's samples would be kept only as often as the greedy token is drawn."""
    _, eng = token_counts(tiny, {'model': str(tiny[0]), 'num_speculative_tokens': 3}, num=300)
    c = eng.stats().spec_decode
    assert c['num_draft_tokens'] >= 200 and c['num_accepted_tokens'] >= 0.95 * c['num_draft_tokens'], c


def test_a_draft_model_of_another_vocabulary_is_refused(tiny_draft, tmp_path):
    "A draft whose tokenizer maps two tokens otherwise than the target's (swapped ids) is refused by name."
    for f in tiny_draft.iterdir():
        shutil.copy(f, tmp_path / f.name)
    spec = json.loads((tmp_path / 'tokenizer.json').read_text())
    vocab = spec['model']['vocab']
    a, b = (next(w for w, i in vocab.items() if i == j) for j in (100, 101))
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (tmp_path / 'tokenizer.json').write_text(json.dumps(spec))
    with pytest.raises(EngineConfigError, match='vocabulary'):
        LLMEngine(num_gpu_blocks=16, speculative_config={'model': str(tmp_path), 'num_speculative_tokens': 2})
