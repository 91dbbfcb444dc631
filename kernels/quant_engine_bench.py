"""The engine on the Llama-3.1-8B shape with random weights in each quantization (load_format dummy): weight memory,
and the decode step at batch 1, 16 and 256 (`run_latency`: 128 prompt tokens, 32 output tokens, greedy).

    python kernels/quant_engine_bench.py --tokenizer DIR [--methods bf16,awq,gptq,fp8] [--out DIR]
"""
import argparse
import gc
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from paged_infer.bench.offline import run_latency  # noqa: E402
from paged_infer.bench.workloads import make_random_model  # noqa: E402
from paged_infer.core.config import EngineConfig  # noqa: E402
from paged_infer.core.engine import LLMEngine  # noqa: E402


def weight_bytes(model) -> int:
    seen, n = set(), 0
    for t in [*model.parameters(), *model.buffers()]:
        if id(t) not in seen:
            seen.add(id(t))
            n += t.numel() * t.element_size()
    return n


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--tokenizer', required=True)
    p.add_argument('--methods', default='bf16,awq,gptq,fp8')
    p.add_argument('--shape', default='llama-3.1-8b')
    p.add_argument('--batch-sizes', default='1,16,256')
    p.add_argument('--out', default='kernels/results/quant/h200')
    a = p.parse_args()
    folder = make_random_model(a.shape, tokenizer_folder=a.tokenizer, weights=False)
    results = []
    for method in a.methods.split(','):
        q = None if method == 'bf16' else method
        engine = LLMEngine(EngineConfig(model=str(folder), load_format='dummy', quantization=q, max_model_len=2048,
                                        gpu_memory_utilization=0.85))
        wb = weight_bytes(engine.model)
        layers = [weight_bytes(m) for n, m in engine.model.named_modules() if n.endswith('.layers.0')]
        row = dict(method=method, weight_GB=round(wb / 1e9, 3), layer0_MB=round(layers[0] / 1e6, 1), steps={})
        for bs in map(int, a.batch_sizes.split(',')):
            r = run_latency(engine, bs, 128, 32, num_iters=3, progress=False)
            row['steps'][bs] = r['decode_step_ms']
            print(f"{method:6s} weights {wb / 1e9:6.2f} GB  batch {bs:4d}: decode step median "
                  f"{r['decode_step_ms']['median']:.3f} ms, prefill {r['prefill_s'] * 1e3:.1f} ms", flush=True)
        results.append(row)
        del engine
        gc.collect()
        torch.cuda.empty_cache()
    base = results[0]
    for r in results:
        ratios = {bs: round(r['steps'][bs]['median'] / base['steps'][bs]['median'], 3) for bs in r['steps']}
        r['step_vs_first'] = ratios
        print(f"{r['method']:6s} weights {r['weight_GB'] / base['weight_GB']:.2f}x of {base['method']}; "
              f"decode step {ratios}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu'
    (out / 'engine.json').write_text(json.dumps(dict(device=device, results=results), indent=1))


if __name__ == '__main__':
    main()
