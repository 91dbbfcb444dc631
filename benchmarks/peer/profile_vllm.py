#!/usr/bin/env python3
"""Real vLLM's offline throughput, then the CUDA kernels of a prefill and of decode steps, as kernels/moe_gap.py
measures paged-infer's.

  cd benchmarks/peer && PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0 python3 profile_vllm.py \
      --model models/qwen3-30b-a3b --workload PAIRS.json --num-requests 256 --out DIR

One engine (bench_vllm.py's settings: random weights, prompts as token ids, prefix caching off, CUDA graphs and
torch.compile as vLLM defaults them). First the throughput run of bench_vllm.py on the pairs (DIR/vllm_<model>.json,
its RESULT line); then kernels/moe_gap.py's four runs (p128, d128, p16, d16: 128 or 16 requests of 512 random prompt
tokens, 1 or 33 output tokens), each with torch.profiler (CUDA activity only) started and stopped inside vLLM's
worker process through `collective_rpc` (the engine core runs in its own process), the kernels of each listed by name,
launches and total microseconds: DIR/vllm_profile_<model>.json, which `kernels/moe_gap.py --summarize` reads.
"""
import argparse, json, os, time

from bench_vllm import make_requests  # sets vLLM's offline environment as it is imported

os.environ.setdefault('VLLM_ALLOW_INSECURE_SERIALIZATION', '1')
RUNS = (('p128', 128, 1), ('d128', 128, 33), ('p16', 16, 1), ('d16', 16, 33))
PROMPT = 512


def _prof_start(worker):  # runs inside the worker (collective_rpc)
    import torch
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    worker._gap_prof = profile(activities=[ProfilerActivity.CUDA])
    worker._gap_prof.start()
    return True


def _prof_stop(worker):
    import torch
    torch.cuda.synchronize()
    prof = worker._gap_prof
    prof.stop()
    rows = []
    for e in prof.key_averages():
        us = getattr(e, 'self_device_time_total', None)
        if us is None:
            us = getattr(e, 'self_cuda_time_total', 0.0)
        if us > 0:
            rows.append([e.key, int(e.count), float(us)])
    del worker._gap_prof
    return sorted(rows, key=lambda r: -r[2])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--model', required=True)
    ap.add_argument('--workload', required=True, help='pairs JSON, as bench_vllm.py')
    ap.add_argument('--num-requests', type=int, default=256)
    ap.add_argument('--max-model-len', type=int, default=4096)
    ap.add_argument('--no-throughput', action='store_true')
    ap.add_argument('--out', required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    vocab = json.load(open(os.path.join(a.model, 'config.json')))['vocab_size']
    name = os.path.basename(os.path.normpath(a.model))
    import numpy as np
    import torch, vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    t0 = time.perf_counter()
    llm = LLM(model=a.model, load_format='dummy', skip_tokenizer_init=True, gpu_memory_utilization=0.9,
              max_model_len=a.max_model_len, enable_prefix_caching=False, seed=0)
    init_s = time.perf_counter() - t0
    sp = lambda n: SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=n, detokenize=False)
    llm.generate([TokensPrompt(prompt_token_ids=list(range(100, 164)))] * 2, sp(16), use_tqdm=False)  # bench_vllm's warm-up
    if not a.no_throughput:
        reqs = make_requests(a.workload, a.num_requests, 0, vocab)
        prompts, params = [TokensPrompt(prompt_token_ids=p) for p, _ in reqs], [sp(o) for _, o in reqs]
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        el = time.perf_counter() - t0
        n_in, n_out = sum(len(p) for p, _ in reqs), sum(len(o.outputs[0].token_ids) for o in outs)
        res = dict(model=name, workload=os.path.basename(a.workload), num_requests=len(reqs), input_tokens=n_in,
                   output_tokens=n_out, elapsed_s=round(el, 3), output_tok_s=round(n_out / el, 1),
                   total_tok_s=round((n_in + n_out) / el, 1), init_s=round(init_s, 1), vllm_version=vllm.__version__,
                   torch_version=torch.__version__, gpu=torch.cuda.get_device_name(0), max_model_len=a.max_model_len)
        print('RESULT', json.dumps(res), flush=True)
        with open(os.path.join(a.out, f'vllm_{name}.json'), 'w') as f:
            f.write(json.dumps(res) + '\n')
    rng = np.random.default_rng(1)
    gen = lambda n, out: llm.generate([TokensPrompt(prompt_token_ids=rng.integers(100, vocab, PROMPT).tolist())
                                       for _ in range(n)], sp(out), use_tqdm=False)
    gen(8, 4)
    runs = {}
    for key, n, out in RUNS:
        llm.collective_rpc(_prof_start)
        t0 = time.perf_counter(); gen(n, out); dt = time.perf_counter() - t0
        table = llm.collective_rpc(_prof_stop)[0]
        runs[key] = dict(requests=n, prompt=PROMPT, output=out, wall_s=dt, kernels=table)
        print(f'{key}: {dt * 1e3:.1f} ms, {sum(r[2] for r in table) / 1e3:.1f} ms of kernels', flush=True)
    with open(os.path.join(a.out, f'vllm_profile_{name}.json'), 'w') as f:
        json.dump(dict(label=f'vLLM {vllm.__version__}', shape=name, runs=runs), f, indent=1)


if __name__ == '__main__':
    main()
