"""Greedy parity on the GPU: the engine through the Triton kernels against Hugging Face, bf16 on both sides.

    PYTHONPATH=. python kernels/gpu_parity.py --assets .gpu_assets/tokenizer --out $OUT

Random-weight models of two named shapes (Qwen2.5-0.5B, Llama-3.1-8B), built here because no weights can be
downloaded on the GPU machine, with the SmolLM2 tokenizer carried along (only token ids matter). For each shape and
each engine setting (plain; a pool small enough to preempt, by recompute and by swap; a shared prefix with cache hits;
a token budget that forces chunked prefill), 8 prompts of 24 to 300 random tokens generate 32 tokens greedily.
Where a token differs from Hugging Face's, the first difference is reported with Hugging Face's top-2 logit gap at
that position: bf16 rounding can only flip a near-tie. CUDA graphs are not used (not built yet).
"""
import argparse, json, shutil, tempfile, time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

from paged_infer.engine import LLMEngine
from paged_infer.sampling_params import SamplingParams

SHAPES = {
    'qwen2.5-0.5b': lambda: Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                                        rope_parameters=dict(rope_type='default', rope_theta=1e6), tie_word_embeddings=True),
    'llama-3.1-8b': lambda: LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072,
                                        rope_parameters=dict(rope_type='llama3', rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                                                             high_freq_factor=4.0, original_max_position_embeddings=8192)),
}
SETTINGS = {'plain': {}, 'preempt-recompute': dict(num_gpu_blocks=40, num_cpu_blocks=0),
            'preempt-swap': dict(num_gpu_blocks=40, num_cpu_blocks=256, preemption_mode='swap'),
            'prefix-cache': dict(shared_prefix=True), 'chunked': dict(max_num_batched_tokens=64)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--assets', default='.gpu_assets/tokenizer')
    ap.add_argument('--out', default='.')
    ap.add_argument('--shapes', default=','.join(SHAPES))
    a = ap.parse_args()
    rows = []
    for name in a.shapes.split(','):
        cfg = SHAPES[name]()
        cfg.max_position_embeddings = 4096
        torch.manual_seed(0)
        with torch.device('cuda'): hf = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
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
            eng = LLMEngine(model=str(folder), device='cuda', **({'num_gpu_blocks': 2048} | kw))
            t0 = time.perf_counter()
            ids = []
            for i, p in enumerate(prompts):
                ids.append(eng.add_request(p, SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)))
                if shared and i == 0: eng.step()  # the shared prefix is computed (and cached) before the others arrive
            done = {}
            while eng.has_unfinished_requests():
                for o in eng.step():
                    if o.finished: done[o.request_id] = o.outputs[0].token_ids
            torch.cuda.synchronize(); dt = time.perf_counter() - t0
            assert eng.block_manager.num_free_blocks == eng.num_gpu_blocks
            same, firsts = 0, []
            for r, p in zip(ids, prompts):
                ours = done[r]
                with torch.inference_mode():
                    out = hf.generate(torch.tensor([p], device='cuda'), max_new_tokens=32, min_new_tokens=32, do_sample=False,
                                      pad_token_id=0, output_logits=True, return_dict_in_generate=True)
                ref = out.sequences[0, len(p):].tolist()
                if ours == ref: same += 1; continue
                k = next(i for i, (x, y) in enumerate(zip(ours, ref)) if x != y)
                top2 = out.logits[k][0].float().topk(2).values
                lg = out.logits[k][0].float()
                firsts.append(dict(pos=k, ours=ours[k], hf=ref[k], hf_top2_gap=float(top2[0] - top2[1]),
                                   gap_ours_vs_hf=float(lg[ref[k]] - lg[ours[k]]), logit_scale=float(lg.abs().max())))
            row = dict(shape=name, setting=setting, identical=f'{same}/8', seconds=dt, preemptions=eng.scheduler.num_preemptions,
                       prefix_hits=eng.block_manager.prefix_hits, first_divergences=firsts)
            print(json.dumps(row)); rows.append(row)
            del eng; torch.cuda.empty_cache()
        del hf; torch.cuda.empty_cache(); shutil.rmtree(folder.parent)
    Path(a.out, 'gpu_parity.json').write_text(json.dumps(rows, indent=1))


if __name__ == '__main__':
    main()
