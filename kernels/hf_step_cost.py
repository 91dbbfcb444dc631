"""Which static batch size is Hugging Face's best on a workload, without running every one in full: HF `generate`'s
cost per decode step, measured at each batch size and two context lengths, summed over the steps each batch size
would run, and checked against the full runs that were measured.

    python kernels/hf_step_cost.py --shape llama-3.1-8b --num-requests 128 --batch-sizes 16,32,64 \
        [--tokenizer DIR] [--out FILE]   # default: kernels/results/hf_step_cost/<machine>/hf_step_cost_b16_b32_b64.json

For each batch size B, the workload's first B requests, left-padded as `run_hf` pads them (prompt length L, the
longest), and the same with `--extra` more prompt tokens each: `generate` with 8 new tokens and with 8 + `--steps`,
greedy, min_new_tokens as in the benchmark; the difference over `--steps` is the time of one decode step at that
batch size and context (prefill cancels out). A step's time is taken as linear in its context between the two
points (and beyond). The predicted time of a full run at batch size B is the sum, over its batches and their steps,
of the step time at that step's context (the batch's L plus the tokens generated so far), plus each batch's prefill
(measured too). Each time is the median of `--repeats` generations, after one warm-up generation at that batch
size. `--check` puts measured full runs beside the predictions: result files of `bench throughput` on the same
workload (their HF entries), or `B=seconds` pairs. With --no-padding the prompts of a batch are filled up to one
length with random tokens instead of padded: HF's step without its attention mask (what the padding costs it; the
prediction then stands for a workload whose batches need no padding).
"""
import argparse, json, statistics, sys, time
from pathlib import Path

import numpy as np
import torch

from paged_infer.bench.hf_baseline import _sync as sync, left_padded, load_hf_model
from paged_infer.bench.workloads import make_random_model, make_workload


def timed_generate(hf, ids, mask, n, pad, repeats=1):
    "Median seconds of `repeats` greedy generations of `n` tokens."
    ts = []
    for _ in range(repeats):
        sync(ids.device); t0 = time.perf_counter()
        with torch.inference_mode():
            hf.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=pad)
        sync(ids.device); ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def measured_runs(check: str, workload) -> dict:
    "batch size -> measured seconds, from `bench throughput` result files (same workload) or `B=seconds` pairs."
    out = {}
    for item in filter(None, check.split(',')):
        if '=' in item: B, s = item.split('='); out[int(B)] = float(s); continue
        r = json.loads(Path(item).read_text())
        if (r['workload']['name'], r['workload']['num_requests'], r['workload']['output_tokens']) != \
                (workload.name, len(workload), workload.num_output_tokens): raise SystemExit(f'{item}: another workload')
        out |= {m['batch_size']: m['elapsed_s'] for m in r['hf']}
    return out


def padded(reqs, extra, vocab, dev, seed, pad=True, pad_id=0):
    "The requests' prompts (+ `extra` random tokens each), left-padded to the longest; with pad=False the shorter ones are filled up with random tokens instead (no padding: transformers then drops the mask and takes SDPA's grouped-query path)."
    g = torch.Generator().manual_seed(seed)
    prompts = [r.prompt_token_ids + torch.randint(100, vocab, (extra,), generator=g).tolist() for r in reqs]
    L = max(map(len, prompts))
    if not pad: prompts = [torch.randint(100, vocab, (L - len(p),), generator=g).tolist() + p for p in prompts]
    return left_padded(prompts, pad_id, dev)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--shape', default='llama-3.1-8b'); ap.add_argument('--tokenizer', default=None, help='a folder with a tokenizer for the random-weight models (default: the default model\'s, under ~/.cache/paged-infer)')
    ap.add_argument('--model', default=None, help='a model folder instead of a random one of --shape')
    ap.add_argument('--workload', default='sharegpt-like'); ap.add_argument('--num-requests', type=int, default=128)
    ap.add_argument('--batch-sizes', default='16,32,64'); ap.add_argument('--extra', type=int, default=1024)
    ap.add_argument('--steps', type=int, default=32); ap.add_argument('--repeats', type=int, default=3)
    ap.add_argument('--check', default='', help='comma-separated: bench result files, or B=seconds')
    ap.add_argument('--no-padding', action='store_true', help='fill prompts to the batch length with random tokens instead of padding')
    ap.add_argument('--device', default='cuda'); ap.add_argument('--out', default=None, help='JSON file (default: kernels/results/hf_step_cost/<machine>/hf_step_cost_b<sizes>.json)')
    a = ap.parse_args()
    from lab import default_out, tokenizer_folder
    if a.out is None:
        a.out = default_out('hf_step_cost') / ('hf_step_cost_' + '_'.join(f'b{b}' for b in a.batch_sizes.split(',')) + ('_unpadded' if a.no_padding else '') + '.json')
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    folder = a.model or make_random_model(a.shape, tokenizer_folder=tokenizer_folder(a.tokenizer), dtype='bfloat16', max_model_len=8192, seed=0)
    hf = load_hf_model(str(folder), 'auto', a.device)
    pad, vocab, dev = hf.generation_config.pad_token_id or 0, hf.config.vocab_size, hf.device
    w = make_workload(a.workload, a.num_requests, vocab_size=vocab)
    reqs = w.requests
    import transformers
    res = dict(command=' '.join(sys.argv), model=str(a.model) if a.model else a.shape, workload=w.summary(), torch=torch.__version__,
               transformers=transformers.__version__, device=torch.cuda.get_device_name() if dev.type == 'cuda' else 'cpu',
               extra=a.extra, steps=a.steps, repeats=a.repeats, padding=not a.no_padding, points=[], predicted={})
    fits = {}  # batch size -> (step s at context c0, c0, its growth per context token, prefill s at L0 and L1, L0, L1)
    for B in map(int, a.batch_sizes.split(',')):
        pts = []
        for extra in (0, a.extra):
            ids, mask, L = padded(reqs[:B], extra, vocab, dev, B, pad=not a.no_padding, pad_id=pad)
            if extra == 0: timed_generate(hf, ids, mask, 2, pad)  # warm-up at this batch size (kernels, allocator)
            t_short = timed_generate(hf, ids, mask, 8, pad, a.repeats)
            t_long = timed_generate(hf, ids, mask, 8 + a.steps, pad, a.repeats)
            step = (t_long - t_short) / a.steps
            prefill = t_short - 7 * step  # the prefill (with its first token) of a batch of this size and context
            pts.append((L + 8 + a.steps / 2, step, L, prefill))
            res['points'].append(dict(batch_size=B, context=L + 8 + a.steps / 2, step_ms=step * 1e3, prompt_len=L, prefill_s=prefill))
            print(json.dumps(res['points'][-1]), flush=True)
            Path(a.out).write_text(json.dumps(res, indent=1))
        (c0, s0, L0, p0), (c1, s1, L1, p1) = pts
        slope = (s1 - s0) / (c1 - c0)
        if slope <= 0:  # a step cannot get cheaper with more context: the two points are within their noise
            print(f'batch {B}: step time fell with context ({s0 * 1e3:.1f} -> {s1 * 1e3:.1f} ms): noise; taking it as flat '
                  f'at their mean (more --repeats would settle it)', flush=True)
            s0, slope = (s0 + s1) / 2, 0.0
        fits[B] = (s0, c0, slope, p0, p1, L0, L1)
    for B, (s0, c0, slope, p0, p1, L0, L1) in fits.items():
        total, n_steps = 0.0, 0
        for i in range(0, len(reqs), B):
            batch = reqs[i:i + B]
            L, T = max(len(r.prompt_token_ids) for r in batch), max(r.output_len for r in batch)
            ctx = L + np.arange(1, T)  # the prefill makes the first token; T - 1 decode steps follow
            total += float(np.sum(s0 + slope * (ctx - c0)))
            total += p0 + (p1 - p0) * (L - L0) / (L1 - L0)  # the batch's prefill, linear in its length
            n_steps += T - 1
        res['predicted'][B] = dict(seconds=total, decode_steps=n_steps, output_tokens_per_s=w.num_output_tokens / total)
        print(f'batch {B}: predicted {total:.0f} s for {n_steps} decode steps (and a prefill a batch), {w.num_output_tokens / total:.1f} output tok/s', flush=True)
    for B, s in measured_runs(a.check, w).items():
        if B in res['predicted']:
            res['predicted'][B]['measured_seconds'] = s
            print(f'batch {B}: measured {s:.0f} s, predicted {res["predicted"][B]["seconds"]:.0f} s '
                  f'({res["predicted"][B]["seconds"] / s - 1:+.1%})', flush=True)
    Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == '__main__':
    main()
