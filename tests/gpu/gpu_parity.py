"""Greedy parity on the GPU: the engine through the Triton kernels, eager and with CUDA graphs, against Hugging Face.

    python tests/gpu/gpu_parity.py [--shapes qwen3-0.6b,qwen2.5-0.5b,llama-3.1-8b,qwen3-30b-a3b-4l,mixtral-8x7b-2l] [--assets DIR] [--out DIR]   # writes DIR/gpu_parity.json

Random-weight models of named shapes (Qwen3-0.6B, Qwen2.5-0.5B, Llama-3.1-8B; a few layers of Qwen3-30B-A3B and
Mixtral-8x7B, whose experts run through chapter 15f's fused kernels), built here because no weights can be
downloaded on the GPU machine, with the SmolLM2 tokenizer carried along (only token ids matter). For each shape,
each engine setting (plain; a pool small enough to preempt, by recompute and by swap; a shared prefix with cache hits;
a token budget that forces chunked prefill) and each mode (eager, CUDA graphs), 8 prompts of 24 to 300 random tokens
generate 32 tokens greedily, bf16 on both sides.

Random weights give flat logits (the top two of 150k random logits are often one bf16 step apart), so two correct
bf16 implementations part ways early; token identity alone says little. So three measures:
- tokens identical to HF bf16 `generate`, and at the first difference HF's top-2 logit gap (a near-tie?) and which of
  the two tokens a float32 copy of the same model prefers (`fp32_prefers`: ours or hf);
- teacher-forced accuracy against float32: along our own output, the log-probability we reported for each token
  against the float32 model's, max abs error; and the same for HF bf16 on the same sequences (`hf_bf16_err`). Ours no
  worse than HF's own bf16 error means the kernels and the engine add nothing beyond bf16 rounding.
"""
import argparse, json, shutil, tempfile, time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, MixtralConfig, Qwen2Config, Qwen3Config, Qwen3MoeConfig

from paged_infer.core.engine import LLMEngine
from paged_infer.model.default_model import prepare_default_model
from paged_infer.core.sampling_params import SamplingParams

SHAPES = {
    'qwen3-0.6b': lambda: Qwen3Config(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                                      num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                                      rope_parameters=dict(rope_type='default', rope_theta=1e6), tie_word_embeddings=True),
    'qwen2.5-0.5b': lambda: Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                                        rope_parameters=dict(rope_type='default', rope_theta=1e6), tie_word_embeddings=True),
    'llama-3.1-8b': lambda: LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072,
                                        rope_parameters=dict(rope_type='llama3', rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                                                             high_freq_factor=4.0, original_max_position_embeddings=8192)),
    # mixtures of experts (chapter 7b), fewer layers than the real models: Qwen3-30B-A3B's and Mixtral-8x7B's layers
    'qwen3-30b-a3b-4l': lambda: Qwen3MoeConfig(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=4,
                                             num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
                                             num_experts_per_tok=8, moe_intermediate_size=768, norm_topk_prob=True,
                                             max_position_embeddings=40960, rope_parameters=dict(rope_type='default', rope_theta=1e6)),
    'mixtral-8x7b-2l': lambda: MixtralConfig(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=2,
                                            num_attention_heads=32, num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2,
                                            max_position_embeddings=32768, rope_parameters=dict(rope_type='default', rope_theta=1e6)),
}
SETTINGS = {'plain': {}, 'preempt-recompute': dict(num_gpu_blocks=40, num_cpu_blocks=0),
            'preempt-swap': dict(num_gpu_blocks=40, num_cpu_blocks=256, preemption_mode='swap'),
            'prefix-cache': dict(shared_prefix=True), 'chunked': dict(max_num_batched_tokens=64)}
N = 32


@torch.inference_mode()
def token_logprobs(model, seq: list, start: int) -> torch.Tensor:
    "log p(seq[i] | seq[:i]) for i >= start, float32, one teacher-forced forward."
    logits = model(torch.tensor([seq], device='cuda')).logits[0, start - 1:-1].float()
    return logits.log_softmax(-1).gather(1, torch.tensor(seq[start:], device='cuda')[:, None])[:, 0]


def main():
    ap = argparse.ArgumentParser(description='Greedy parity on the GPU against Hugging Face, bf16.')
    ap.add_argument('--assets', default=None, help='a folder with the tokenizer (and config.json) to use (default: the default model\'s, converted under ~/.cache/paged-infer on first use)')
    ap.add_argument('--out', default='.', help='results folder (default: the current directory)')
    ap.add_argument('--shapes', default=','.join(SHAPES))
    ap.add_argument('--name', default='gpu_parity', help='the results file: OUT/NAME.json')
    a = ap.parse_args()
    a.assets = a.assets or str(prepare_default_model())
    Path(a.out).mkdir(parents=True, exist_ok=True)
    rows = []
    for name in a.shapes.split(','):
        cfg = SHAPES[name]()
        cfg.max_position_embeddings = 4096
        torch.manual_seed(0)
        with torch.device('cuda'): hf = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
        with torch.device('cuda'): ref = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
        ref.load_state_dict({k: v.float() for k, v in hf.state_dict().items()})  # the same weights, computed in float32
        folder = Path(tempfile.mkdtemp()) / name
        hf.save_pretrained(folder)
        for f in Path(a.assets).glob('tokenizer*'): shutil.copy(f, folder / f.name)
        g = torch.Generator().manual_seed(1)
        V = cfg.vocab_size
        prefix = torch.randint(0, V, (160,), generator=g).tolist()
        for setting, kw in SETTINGS.items():
            kw = dict(kw)
            shared = kw.pop('shared_prefix', False)
            prompts = [(prefix if shared else []) + torch.randint(0, V, (int(n),), generator=g).tolist()
                       for n in torch.randint(24, 300 if not shared else 60, (8,), generator=g)]
            hf_out = []
            for p in prompts:
                with torch.inference_mode():
                    o = hf.generate(torch.tensor([p], device='cuda'), max_new_tokens=N, min_new_tokens=N, do_sample=False,
                                    pad_token_id=0, output_logits=True, return_dict_in_generate=True)
                hf_out.append((o.sequences[0, len(p):].tolist(), o.logits))
            for eager in (True, False):
                eng = LLMEngine(model=str(folder), device='cuda', max_num_seqs=16, enforce_eager=eager,
                                **({'num_gpu_blocks': 2048} | kw))
                t0 = time.perf_counter()
                ids = []
                for i, p in enumerate(prompts):
                    ids.append(eng.add_request(p, SamplingParams(temperature=0, max_tokens=N, ignore_eos=True, logprobs=0)))
                    if shared and i == 0: eng.step()  # the shared prefix is computed (and cached) before the others arrive
                done = {}
                while eng.has_unfinished_requests():
                    for o in eng.step():
                        if o.finished: done[o.request_id] = o.outputs[0]
                torch.cuda.synchronize(); dt = time.perf_counter() - t0
                assert eng.block_manager.num_free_blocks == eng.num_gpu_blocks
                same, firsts, ours_err, hf_err = 0, [], 0.0, 0.0
                for r, p, (hf_ids, hf_logits) in zip(ids, prompts, hf_out):
                    c = done[r]
                    ours = c.token_ids
                    our_lp = torch.tensor([d[t] for d, t in zip(c.logprobs, ours)], device='cuda')
                    ref_lp = token_logprobs(ref, p + ours, len(p))
                    ours_err = max(ours_err, float((our_lp - ref_lp).abs().max()))
                    hf_err = max(hf_err, float((token_logprobs(hf, p + ours, len(p)) - ref_lp).abs().max()))
                    if ours == hf_ids: same += 1; continue
                    k = next(i for i, (x, y) in enumerate(zip(ours, hf_ids)) if x != y)
                    lg = hf_logits[k][0].float()
                    top2 = lg.topk(2).values
                    with torch.inference_mode(): rl = ref(torch.tensor([p + ours[:k]], device='cuda')).logits[0, -1].float()
                    firsts.append(dict(pos=k, ours=ours[k], hf=hf_ids[k], hf_top2_gap=float(top2[0] - top2[1]),
                                       logit_scale=float(lg.abs().max()), fp32_gap_ours_minus_hf=float(rl[ours[k]] - rl[hf_ids[k]]),
                                       fp32_prefers='ours' if rl[ours[k]] > rl[hf_ids[k]] else 'hf' if rl[ours[k]] < rl[hf_ids[k]] else 'tie'))
                row = dict(shape=name, setting=setting, mode='eager' if eager else 'cuda-graphs', identical=f'{same}/8',
                           ours_vs_fp32_max_logprob_err=ours_err, hf_bf16_vs_fp32_max_logprob_err=hf_err,
                           seconds=dt, preemptions=eng.scheduler.num_preemptions, prefix_hits=eng.block_manager.prefix_hits,
                           graphs=sorted(eng.runner.graphs.graphs) if eng.runner.graphs else None, first_divergences=firsts)
                print(json.dumps({k: v for k, v in row.items() if k != 'first_divergences'}), flush=True)
                rows.append(row)
                del eng; torch.cuda.empty_cache()
                Path(a.out, f'{a.name}.json').write_text(json.dumps(rows, indent=1))
        del hf, ref; torch.cuda.empty_cache(); shutil.rmtree(folder.parent)


if __name__ == '__main__':
    main()
