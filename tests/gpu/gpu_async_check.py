"""Async scheduling on the GPU: the same greedy tokens as the synchronous engine and as Hugging Face, in float32.

    python tests/gpu/gpu_async_check.py [--assets DIR] [--out DIR]   # writes DIR/gpu_async_check.json

A random-weight model of the Qwen2.5-0.5B shape (its bf16 folder, upcast: float32 makes near-ties rare, and the
attention kernels multiply float32 exactly, chapter 15). 8 prompts of 24-300 random tokens, greedy, `max_tokens`
from 9 to 37 (so requests finish at different steps, while the next step is already on the GPU), against HF float32
`generate`. Engine runs: sync with CUDA graphs; async with CUDA graphs, eager, with a pool small enough to preempt
by swapping and by recompute (22 blocks, found on the CPU with the same lengths to preempt once or twice; scheduling depends on lengths only), with chunked prefill (64-token budget), and with one-token blocks (the kernels' warm-up and
block tables at their smallest). Each must give HF's tokens (a prefix of
HF's 40) and leave its pool all free. Then the same in bfloat16, sync against async (graphs): random weights give
flat logits, so a different batch size (async runs a finished request one extra step) may flip near-ties; the
count of identical requests is reported, not asserted. Multi-step (`num_scheduler_steps` 4 and 8: several decode steps
per launch, each fed the step before's tokens on the device) is run the same ways (graphs sync and async, eager, both
preemptions, one-token blocks) and must give HF's tokens too; and seeded top-p sampling must give the same tokens with
4 steps per launch as with one.
"""
import argparse, json, time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from gpu_tp_check import first_diff, hf_greedy
from paged_infer.bench.workloads import make_random_model
from paged_infer.core.engine import LLMEngine
from paged_infer.model.default_model import prepare_default_model
from paged_infer.core.sampling_params import SamplingParams


def run(folder, prompts, dtype, seeded=False, **kw):
    t0 = time.perf_counter()
    eng = LLMEngine(model=str(folder), dtype=dtype, device='cuda', max_num_seqs=16, **({'num_gpu_blocks': 1024} | kw))
    ids = [eng.add_request(p, SamplingParams(temperature=0.8, top_p=0.9, seed=i, max_tokens=9 + 4 * i, ignore_eos=True) if seeded else
                           SamplingParams(temperature=0, max_tokens=9 + 4 * i, ignore_eos=True)) for i, p in enumerate(prompts)]
    launches, launch = [], eng.runner.launch
    eng.runner.launch = lambda *a: launches.append(a[4] if len(a) > 4 else None) or launch(*a)
    done, overlapped, steps = {}, 0, 0
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished: done[o.request_id] = o.outputs[0].token_ids
        overlapped += eng.inflight is not None; steps += 1
    assert eng.block_manager.num_free_blocks == eng.num_gpu_blocks, 'blocks leaked'
    multi = [k for k in launches if k is not None]
    info = dict(steps=steps, steps_in_flight=overlapped, multi_step_launches=len(multi), most_steps=max(map(max, multi), default=1), preemptions=eng.scheduler.num_preemptions, graphs=eng.runner.graphs is not None,
                async_scheduling=eng.config.async_scheduling, s=round(time.perf_counter() - t0, 1))
    del eng; torch.cuda.empty_cache()
    return [done[i] for i in ids], info


def main():
    ap = argparse.ArgumentParser(description='Async scheduling and multi-step on the GPU against sync and HF float32.')
    ap.add_argument('--assets', default=None, help='a folder with the tokenizer (and config.json) to use (default: the default model\'s, converted under ~/.cache/paged-infer on first use)')
    ap.add_argument('--out', default='.', help='results folder (default: the current directory)')
    a = ap.parse_args()
    a.assets = a.assets or str(prepare_default_model())
    Path(a.out).mkdir(parents=True, exist_ok=True)
    folder = make_random_model('qwen2.5-0.5b', tokenizer_folder=a.assets, dtype='bfloat16', max_model_len=8192, seed=0, device='cuda')
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 151936, (int(n),), generator=g).tolist() for n in torch.randint(24, 300, (8,), generator=g)]
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to('cuda').eval()
    ref = hf_greedy(hf, prompts, 40)
    del hf; torch.cuda.empty_cache()
    rows = []
    plan = [('fp32 sync graphs', 'float32', dict(async_scheduling=False)), ('fp32 async graphs', 'float32', dict(async_scheduling=True)),
            ('fp32 async eager', 'float32', dict(async_scheduling=True, enforce_eager=True)),
            ('fp32 async preempt-swap', 'float32', dict(async_scheduling=True, num_gpu_blocks=22, num_cpu_blocks=256, preemption_mode='swap')),
            ('fp32 async preempt-recompute', 'float32', dict(async_scheduling=True, num_gpu_blocks=22, num_cpu_blocks=0)),
            ('fp32 async chunked', 'float32', dict(async_scheduling=True, max_num_batched_tokens=64)),
            ('fp32 async graphs block_size 1', 'float32', dict(async_scheduling=True, block_size=1, num_gpu_blocks=16384)),
            ('bf16 sync graphs', 'bfloat16', dict(async_scheduling=False)), ('bf16 async graphs', 'bfloat16', dict(async_scheduling=True)),
            # multi-step (num_scheduler_steps): several decode steps per launch, inputs advanced on the device
            ('fp32 multi4 async graphs', 'float32', dict(async_scheduling=True, num_scheduler_steps=4)),
            ('fp32 multi8 sync graphs', 'float32', dict(async_scheduling=False, num_scheduler_steps=8)),
            ('fp32 multi4 async eager', 'float32', dict(async_scheduling=True, enforce_eager=True, num_scheduler_steps=4)),
            ('fp32 multi4 async preempt-swap', 'float32', dict(async_scheduling=True, num_gpu_blocks=22, num_cpu_blocks=256, preemption_mode='swap', num_scheduler_steps=4)),
            ('fp32 multi4 async preempt-recompute', 'float32', dict(async_scheduling=True, num_gpu_blocks=22, num_cpu_blocks=0, num_scheduler_steps=4)),
            ('fp32 multi4 async graphs block_size 1', 'float32', dict(async_scheduling=True, block_size=1, num_gpu_blocks=16384, num_scheduler_steps=4)),
            ('bf16 multi8 async graphs', 'bfloat16', dict(async_scheduling=True, num_scheduler_steps=8)),
            # seeded sampling (top-p): the sampler runs outside the graph, each row's generator once a step either way
            ('seeded async graphs', 'float32', dict(async_scheduling=True, seeded=True)),
            ('seeded multi4 async graphs', 'float32', dict(async_scheduling=True, num_scheduler_steps=4, seeded=True))]
    outs = {}
    for name, dtype, kw in plan:
        toks, info = run(folder, prompts, dtype, **kw)
        outs[name] = toks
        row = dict(run=name, **info)
        if kw.get('seeded'):
            if name.startswith('seeded multi'): row |= dict(identical_to_seeded_async=f"{sum(x == y for x, y in zip(toks, outs['seeded async graphs']))}/8")
        elif dtype == 'float32':
            diffs = [first_diff(t, r[:len(t)]) for t, r in zip(toks, ref)]
            row |= dict(identical_to_hf_fp32=f'{sum(d is None for d in diffs)}/8', first_diffs=diffs,
                        identical_to_sync=f"{sum(x == y for x, y in zip(toks, outs['fp32 sync graphs']))}/8")
        else:
            row |= dict(identical_to_bf16_sync=f"{sum(x == y for x, y in zip(toks, outs['bf16 sync graphs']))}/8",
                        first_diffs_from_sync=[first_diff(x, y) for x, y in zip(toks, outs['bf16 sync graphs'])])
        print(json.dumps(row), flush=True)
        rows.append(row)
        Path(a.out, 'gpu_async_check.json').write_text(json.dumps(rows, indent=1))
    bad = [r['run'] for r in rows if r['run'].startswith('fp32') and (r['identical_to_hf_fp32'] != '8/8' or r['identical_to_sync'] != '8/8')]
    bad += [r['run'] + ': no preemption' for r in rows if 'preempt' in r['run'] and not r['preemptions']]
    bad += [r['run'] + ': no multi-step launch' for r in rows if 'multi' in r['run'] and not r['multi_step_launches']]
    bad += [r['run'] for r in rows if r['run'].startswith('seeded multi') and r['identical_to_seeded_async'] != '8/8']
    if bad: raise SystemExit(f'FAILED: {bad}')
    print('all float32 runs identical to HF and to sync; the small pools preempted')


if __name__ == '__main__':
    main()
