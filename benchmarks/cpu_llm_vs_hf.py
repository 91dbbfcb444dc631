"""Offline throughput on this CPU: paged-infer's LLM.generate against Hugging Face generate, same run, same work.

    .venv/bin/python benchmarks/cpu_llm_vs_hf.py [--n 32] [--scale 8] [--hf-batch 16]

Workload: chapter 1's ShareGPT-like lengths (log-normal, means 161 in / 338 out), divided by --scale so that a CPU
finishes in minutes; prompts are random token ids and every request generates exactly its output length
(ignore_eos here, min_new_tokens there). Hugging Face runs static batches of --hf-batch requests in arrival order,
left-padded, each batch to its longest output (BENCHMARKS.md's baseline); only the tokens a request asked for count.
Both sides use the default model (SmolLM2-135M-Instruct) in float32. Raw results go to benchmarks/results/.
"""
import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM

from paged_infer.default_model import prepare_default_model
from paged_infer.engine import LLM
from paged_infer.sampling_params import SamplingParams
from paged_infer.why_paging import sharegpt_like


def workload(n, scale, seed=0):
    w = sharegpt_like(n, seed=seed, max_model_len=2048)
    rng = np.random.default_rng(seed)
    lens = [(max(1, p // scale), max(1, o // scale)) for p, o in w]
    return [rng.integers(100, 40000, p).tolist() for p, _ in lens], [o for _, o in lens]


def run_hf(prompts, outs, batch, pad_id):
    hf = AutoModelForCausalLM.from_pretrained(prepare_default_model(), dtype=torch.float32).eval()
    t0 = time.perf_counter()
    for i in range(0, len(prompts), batch):
        ps, os_ = prompts[i:i + batch], outs[i:i + batch]
        L = max(len(p) for p in ps)
        ids = torch.tensor([[pad_id] * (L - len(p)) + p for p in ps])
        mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in ps])
        with torch.inference_mode():
            hf.generate(ids, attention_mask=mask, max_new_tokens=max(os_), min_new_tokens=max(os_), do_sample=False, pad_token_id=pad_id)
    return time.perf_counter() - t0


def run_ours(prompts, outs, **engine_kw):
    llm = LLM(**engine_kw)
    params = [SamplingParams(temperature=0, max_tokens=o, ignore_eos=True) for o in outs]
    eng, peak, util = llm.engine, [0, 0.0], []
    orig = eng.step

    def step():  # record the most sequences held at once, the KV pool's use, and the share of held slots with a token
        r = orig()
        live = [s for g in eng.scheduler.running for s in g.seqs if not s.is_finished]
        used = eng.num_gpu_blocks - eng.block_manager.num_free_blocks
        peak[0] = max(peak[0], len(live))
        peak[1] = max(peak[1], eng.block_manager.usage)
        if live: util.append(sum(s.num_tokens for s in live) / (used * eng.config.block_size))
        return r
    eng.step = step
    t0 = time.perf_counter()
    res = llm.generate([{'prompt_token_ids': p} for p in prompts], params, use_tqdm=False)
    dt = time.perf_counter() - t0
    assert [len(r.outputs[0].token_ids) for r in res] == outs
    return dt, peak, float(np.mean(util)), eng.num_gpu_blocks, eng.scheduler.num_preemptions


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--n', type=int, default=32)
    ap.add_argument('--scale', type=int, default=8)
    ap.add_argument('--hf-batch', type=int, default=16)
    ap.add_argument('--max-num-seqs', type=int, default=64)
    ap.add_argument('--num-blocks', type=int, default=None, help='KV pool size in blocks (default: 1 GiB)')
    ap.add_argument('--skip-hf', action='store_true', help='measure paged-infer only')
    a = ap.parse_args()
    torch.manual_seed(0)
    prompts, outs = workload(a.n, a.scale)
    n_in, n_out = sum(map(len, prompts)), sum(outs)
    kw = dict(max_num_seqs=a.max_num_seqs) | (dict(num_gpu_blocks=a.num_blocks) if a.num_blocks else {})
    t_ours, (peak_seqs, peak_usage), util, blocks, preempt = run_ours(prompts, outs, **kw)
    t_hf = float('nan') if a.skip_hf else run_hf(prompts, outs, a.hf_batch, pad_id=2)
    r = dict(machine=platform.processor() or platform.machine(), threads=torch.get_num_threads(), n=a.n, scale=a.scale,
             input_tokens=n_in, output_tokens=n_out, hf_batch=a.hf_batch,
             ours_s=t_ours, hf_s=t_hf, ours_out_tok_s=n_out / t_ours, hf_out_tok_s=n_out / t_hf,
             ours_total_tok_s=(n_in + n_out) / t_ours, hf_total_tok_s=(n_in + n_out) / t_hf, ratio=t_hf / t_ours,
             ours_peak_running_seqs=peak_seqs, ours_peak_kv_usage=peak_usage, ours_mean_token_states_per_held_slot=util,
             ours_blocks=blocks, ours_preemptions=preempt,
             max_len_reservation_seqs=blocks * 16 // (2048 // a.scale))  # contiguous max-length reservation, same pool
    r['note'] = 'max_len_reservation_seqs: sequences a contiguous reservation of max_model_len/scale tokens each would fit in the same pool'
    print(json.dumps(r, indent=1))
    tag = f'_blocks{a.num_blocks}' if a.num_blocks else ''
    out = Path(__file__).parent / 'results' / f'cpu_llm_vs_hf_n{a.n}_s{a.scale}_b{a.hf_batch}{tag}.json'
    out.write_text(json.dumps(r, indent=1) + '\n')


if __name__ == '__main__':
    main()
