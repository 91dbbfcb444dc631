"""Greedy decoding through the paged engine path is token-identical to Hugging Face transformers.

- SmolLM2-135M-Instruct (the default model): 8 prompts of different lengths, half through the chat template, run
  together in one static batch, 64 new tokens each; tokens identical to HF's greedy `generate` on each prompt alone,
  and the logits of every sampled position within 1e-3 of HF's, in float32.
- Small random-weight Qwen2 (qkv bias, 4 query heads over 2 KV heads), Qwen3 (a norm over each head of q and k,
  head_dim 64 where hidden_size / heads is 32, tied embeddings) and Llama (llama3 rope scaling, 8 over 2)
  configurations built here, so that each architecture branch is covered.
"""
import pytest
import torch
from transformers import (AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM as HFLlama, Qwen2Config, Qwen2ForCausalLM,
                          Qwen3Config, Qwen3ForCausalLM, MixtralConfig, MixtralForCausalLM, Qwen3MoeConfig,
                          Qwen3MoeForCausalLM)

from paged_infer.cache.block_manager import BlockManager
from paged_infer.model.default_model import prepare_default_model
from paged_infer.model.llama import LlamaForCausalLM, ModelConfig
from paged_infer.worker.model_runner import ModelRunner, load_model
from paged_infer.bench.offline import generate_static
from paged_infer.ops.sampler import Sampler
from paged_infer.core.sampling_params import SamplingParams
from paged_infer.core.sequence import Sequence
from paged_infer.model.weights import load_weights

CHATS = ['Hi there!', 'What is the capital of France?', 'Write a short haiku about memory and forgetting, please.',
         'List three uses of a hash table, and say which one you like best and why, in detail.']
TEXTS = ['The quick brown fox', 'def fibonacci(n):',
         'Once upon a time, in a land far away, there lived a',
         'PagedAttention is an attention algorithm inspired by the classical idea of virtual memory and paging in '
         'operating systems. Unlike the traditional attention algorithms, PagedAttention allows storing continuous '
         'keys and values in non-contiguous memory space. Specifically, it']


class RecordingSampler(Sampler):
    "The real sampler, keeping each step's logits and the sequences they belong to."
    def __init__(self):
        super().__init__()
        self.logits = []

    def __call__(self, logits, batch):
        self.logits.append(logits.clone())
        return super().__call__(logits, batch)


def run_paged(model, prompts, n_new, eos_token_id, block_size=16, num_blocks=None):
    sampler = RecordingSampler()
    need = sum(-(-(len(p) + n_new) // block_size) for p in prompts)
    num_blocks = num_blocks or need + 4
    runner = ModelRunner(model, num_blocks=num_blocks, block_size=block_size, eos_token_id=eos_token_id, sampler=sampler)
    bm = BlockManager(num_blocks, block_size, watermark=0)
    params = SamplingParams(temperature=0, max_tokens=n_new, min_tokens=n_new)
    seqs = [Sequence(p, params) for p in prompts]
    order = {}  # seq_id -> list of logits rows, rebuilt from the runner's sampling order
    orig_execute = runner.execute

    def execute(live, n, tables):
        sampled, out = orig_execute(live, n, tables)
        for i, s in enumerate(sampled): order.setdefault(s.seq_id, []).append(sampler.logits[-1][i])
        return sampled, out
    runner.execute = execute
    generate_static(runner, bm, seqs)
    assert bm.num_free_blocks == num_blocks, 'blocks leaked'
    return [s.output_token_ids for s in seqs], [torch.stack(order[s.seq_id]) for s in seqs]


def run_hf(hf, prompt, n_new, pad_id):
    out = hf.generate(torch.tensor([prompt]), max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False,
                      pad_token_id=pad_id, output_logits=True, return_dict_in_generate=True)
    return out.sequences[0, len(prompt):].tolist(), torch.cat(out.logits).float()


@pytest.fixture(scope='module')
def smollm():
    model, tok = load_model()
    hf = AutoModelForCausalLM.from_pretrained(prepare_default_model(), dtype=torch.float32).eval()
    return model, tok, hf


def test_smollm2_batch_matches_hf(smollm):
    model, tok, hf = smollm
    prompts = [tok.apply_chat_template([{'role': 'user', 'content': c}], add_generation_prompt=True, tokenize=True,
                                       return_dict=False) for c in CHATS] + [tok.encode(t) for t in TEXTS]
    assert len({len(p) for p in prompts}) == len(prompts), 'prompts of different lengths'
    n_new = 64
    ours, our_logits = run_paged(model, prompts, n_new, tok.eos_token_id)
    for p, toks, logits in zip(prompts, ours, our_logits):
        ref, ref_logits = run_hf(hf, p, n_new, tok.eos_token_id)
        assert toks == ref, f'diverged at token {next(i for i, (a, b) in enumerate(zip(toks, ref)) if a != b)}: ' \
                            f'{tok.decode(toks)!r} vs {tok.decode(ref)!r}'
        assert (logits - ref_logits).abs().max().item() < 1e-3


def tiny_config(kind):
    common = dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=3, max_position_embeddings=512,
                  initializer_range=0.2, tie_word_embeddings=False)
    if kind == 'qwen3':
        common['tie_word_embeddings'] = True
        return Qwen3Config(num_attention_heads=4, num_key_value_heads=2, head_dim=64, rope_parameters=dict(rope_type='default', rope_theta=1e6), **common), Qwen3ForCausalLM
    if kind == 'mixtral':  # 4 experts, 2 a token, every layer
        return MixtralConfig(num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                             rope_parameters=dict(rope_type='default', rope_theta=1e6), **common), MixtralForCausalLM
    if kind == 'qwen3_moe':  # 8 experts, 2 a token, unnormalized weights; layer 1 dense, as mlp_only_layers says
        return Qwen3MoeConfig(num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_experts=8,
                              num_experts_per_tok=2, moe_intermediate_size=64, norm_topk_prob=False, mlp_only_layers=[1],
                              rope_parameters=dict(rope_type='default', rope_theta=1e6), **common), Qwen3MoeForCausalLM
    if kind == 'qwen2':
        return Qwen2Config(num_attention_heads=4, num_key_value_heads=2, rope_parameters=dict(rope_type='default', rope_theta=1e6), **common), Qwen2ForCausalLM
    l3 = dict(rope_type='llama3', rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
              original_max_position_embeddings=64)  # small original length: the scaled bands matter at these positions
    return LlamaConfig(num_attention_heads=8, num_key_value_heads=2, head_dim=16, rope_parameters=l3, **common), HFLlama


@pytest.mark.parametrize('kind', ['qwen2', 'qwen3', 'llama3', 'mixtral', 'qwen3_moe'])
def test_random_weights_match_hf(kind, tmp_path):
    torch.manual_seed(0)
    hf_cfg, cls = tiny_config(kind)
    hf = cls(hf_cfg).eval()
    if kind == 'qwen2':  # HF initializes biases to zero; make them matter
        for layer in hf.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj): torch.nn.init.normal_(proj.bias, std=0.5)
    if kind in ('qwen3', 'qwen3_moe'):  # HF initializes the head norms to ones; make them matter
        for layer in hf.model.layers:
            for norm in (layer.self_attn.q_norm, layer.self_attn.k_norm): torch.nn.init.normal_(norm.weight, mean=1.0, std=0.5)
    hf.save_pretrained(tmp_path)
    cfg = ModelConfig.from_hf(hf_cfg)
    if kind in ('mixtral', 'qwen3_moe'):  # experts where HF has them (chapter 7b)
        assert cfg.moe_layers == ((0, 1, 2) if kind == 'mixtral' else (0, 2)) and cfg.norm_topk_prob == (kind == 'mixtral')
    assert cfg.qkv_bias == (kind == 'qwen2') and cfg.qk_norm == (kind in ('qwen3', 'qwen3_moe')) and cfg.rope_scaling.get('rope_type') == ('llama3' if kind == 'llama3' else 'default')
    with torch.device('meta'): model = LlamaForCausalLM(cfg)
    load_weights(model, tmp_path, torch.float32, 'cpu')
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (3, 17, 40, 90)]
    ours, our_logits = run_paged(model.eval(), prompts, 40, eos_token_id=None, block_size=8)
    for p, toks, logits in zip(prompts, ours, our_logits):
        ref, ref_logits = run_hf(hf, p, 40, pad_id=0)
        assert toks == ref
        assert (logits - ref_logits).abs().max().item() < 1e-3


@pytest.mark.parametrize('kind,mode', [('qwen3', 'cached'), ('qwen3', 'uncached-recompute'), ('qwen3', 'cached-swap'),
                                       ('mixtral', 'cached-swap'), ('qwen3_moe', 'uncached-recompute')])
def test_through_the_engine_matches_hf(kind, mode, tmp_path):
    """A random-weight Qwen3, Mixtral or Qwen3-MoE folder (the default model's tokenizer beside it) served by the
    engine: greedy answers to prompts that share a prefix, with prefix caching on or off, in a pool small enough that
    requests are preempted (by recompute or by swap), are token-identical to transformers' generate on each prompt alone."""
    import shutil
    from paged_infer.entrypoints.llm import LLM
    torch.manual_seed(0)
    hf_cfg, cls = tiny_config(kind)
    hf_cfg.vocab_size = 49152  # the default tokenizer's
    hf = cls(hf_cfg).eval()
    for layer in hf.model.layers if kind != 'mixtral' else []:
        for norm in (layer.self_attn.q_norm, layer.self_attn.k_norm): torch.nn.init.normal_(norm.weight, mean=1.0, std=0.5)
    hf.save_pretrained(tmp_path)
    for f in ('tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json'):
        if (prepare_default_model() / f).exists(): shutil.copy(prepare_default_model() / f, tmp_path)
    g = torch.Generator().manual_seed(2)
    shared = torch.randint(0, 49152, (24,), generator=g).tolist()
    prompts = [shared + torch.randint(0, 49152, (n,), generator=g).tolist() for n in (5, 12, 20, 3)]
    llm = LLM(model=str(tmp_path), dtype='float32', num_gpu_blocks=12, block_size=8, max_model_len=96,
              enable_prefix_caching=mode.startswith('cached'), preemption_mode='swap' if 'swap' in mode else 'recompute',
              num_cpu_blocks=32)
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    outs = llm.generate([{'prompt_token_ids': p} for p in prompts], params, use_tqdm=False)
    for p, out in zip(prompts, outs):
        ref, _ = run_hf(hf, p, 30, pad_id=0)
        assert out.outputs[0].token_ids == ref
    assert llm.engine.scheduler.num_preemptions > 0, 'the pool (96 tokens) is smaller than the batch (about 240)'
    if mode.startswith('cached'):
        assert llm.engine.block_manager.prefix_hits > 0
    assert llm.engine.block_manager.num_free_blocks == 12


@pytest.mark.parametrize('mode', ['whole', 'chunked', 'preempted'])
def test_prompt_logprobs_match_hf(smollm, mode):
    """prompt_logprobs: each prompt token's logprob under the model (the first: None) and the top 3 at its place, within
    1e-4 of transformers' log-softmax over one forward of the prompt, in float32; whole, in chunks of a 32-token budget,
    and in a pool small enough to preempt; a prompt whose prefix is in the prefix cache still gets all of them."""
    from paged_infer.entrypoints.llm import LLM
    _, tok, hf = smollm
    cfg = {'whole': {}, 'chunked': dict(max_num_batched_tokens=32, enable_chunked_prefill=True),
           'preempted': dict(num_gpu_blocks=12, block_size=8, max_model_len=96)}[mode]
    llm = LLM(**{'num_gpu_blocks': 64, **cfg})
    texts = ['Hi', 'The quick brown fox jumps over the lazy cat and', 'The quick brown fox jumps over the lazy dog. ' * 3]
    prompts = [tok(t).input_ids for t in texts]  # the last to arrive, the first preempted: the longest prompt
    llm.generate([{'prompt_token_ids': prompts[2]}], SamplingParams(max_tokens=2), use_tqdm=False)  # now cached
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True, prompt_logprobs=3)
    outs = llm.generate([{'prompt_token_ids': p} for p in prompts], params, use_tqdm=False)
    for p, out in zip(prompts, outs):
        with torch.no_grad():
            ref = hf(torch.tensor([p])).logits[0].float().log_softmax(-1)
        got = out.prompt_logprobs
        assert len(got) == len(p) and got[0] is None and out.num_cached_tokens == 0
        for j in range(1, len(p)):
            assert abs(got[j][p[j]] - ref[j - 1, p[j]].item()) < 1e-4, (j, got[j], ref[j - 1, p[j]])
            top = ref[j - 1].topk(3)
            assert set(top.indices.tolist()) <= set(got[j]) and len(got[j]) <= 4
    if mode == 'preempted':
        assert llm.engine.scheduler.num_preemptions > 0
    assert llm.engine.block_manager.num_free_blocks == llm.engine.block_manager.gpu.num_blocks


def test_prompt_logprobs_survive_a_recompute_in_the_middle_of_a_chunked_prefill(smollm, monkeypatch):
    """A 60-token prompt with prompt_logprobs, prefilled 16 tokens a step beside a decoding request, in a pool (9 blocks
    of 8) that the decode outgrows: the prompt is preempted while its list is partial and recomputed from the start;
    its list is whole, each entry once, and within 1e-4 of transformers'."""
    from paged_infer.core.scheduler import Scheduler
    from paged_infer.entrypoints.llm import LLM
    _, tok, hf = smollm
    partial, preempt = [], Scheduler._preempt

    def spy(self, g, out):  # how far each preempted prompt's list had come
        partial.extend(len(s.prompt_logprobs) for s in g.seqs if s.prompt_logprobs is not None)
        return preempt(self, g, out)

    monkeypatch.setattr(Scheduler, '_preempt', spy)
    llm = LLM(num_gpu_blocks=9, block_size=8, max_model_len=72, max_num_batched_tokens=16, enable_chunked_prefill=True)
    a = tok('Count from one to one hundred:').input_ids
    b = tok('The quick brown fox jumps over the lazy dog. ' * 6).input_ids[:60]
    params = [SamplingParams(max_tokens=48, temperature=0, ignore_eos=True), SamplingParams(max_tokens=2, prompt_logprobs=0)]
    got = llm.generate([{'prompt_token_ids': a}, {'prompt_token_ids': b}], params, use_tqdm=False)[1].prompt_logprobs
    assert any(1 < n < len(b) for n in partial), partial
    with torch.no_grad():
        ref = hf(torch.tensor([b])).logits[0].float().log_softmax(-1)
    assert len(got) == len(b) and got[0] is None
    assert all(abs(got[j][b[j]] - ref[j - 1, b[j]].item()) < 1e-4 for j in range(1, len(b)))
