"""Where a speculative decoding step's time goes, on the host and waiting for the GPU, against a plain step.

    python kernels/spec_step_profile.py [--ks 0,4,8] [--batch 1] [--out FILE.json] [--trace DIR]

The default model, one copy-heavy chat prompt per sequence (greedy, 256 tokens). Each engine function of the step is
wrapped in a wall-clock timer; the table gives milliseconds per step for each, the steps, the tokens per step, and how
many forwards replayed a CUDA graph or ran eagerly. With --trace, steps 5 to 24 of each run are also recorded by the
torch profiler (host calls and GPU kernels) into DIR/trace_k<k>_b<batch>.json.gz, for chrome://tracing or Perfetto.
"""
import argparse
import json
import time
from collections import defaultdict

import torch

from paged_infer.core.engine import LLMEngine
from paged_infer.core.sampling_params import SamplingParams

PASSAGE = ('The river rose slowly through the night. By morning the lower fields were under water, and the farmers '
           'moved their cattle to the hill behind the church, where the grass was thin but the ground was dry. ') * 3


def wrap(obj, name, times, counts):
    f = getattr(obj, name)

    def timed(*a, **k):
        t0 = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            times[name] += time.perf_counter() - t0
            counts[name] += 1

    setattr(obj, name, timed)


def stop_trace(prof, path: str):
    torch.cuda.synchronize()
    prof.stop()
    prof.export_chrome_trace(path)


def profile(k: int, batch: int, trace: str | None = None) -> dict:
    spec = {'method': 'ngram', 'num_speculative_tokens': k, 'prompt_lookup_max': 4, 'prompt_lookup_min': 2}
    spec = spec if k else None
    eng = LLMEngine(device='cuda', max_num_seqs=max(8, batch), num_gpu_blocks=4096, speculative_config=spec)
    tok = eng.tokenizer
    prompt = tok.apply_chat_template([{'role': 'user', 'content': 'Repeat this passage exactly:\n\n' + PASSAGE}],
                                     add_generation_prompt=True, tokenize=True, return_dict=False)
    params = SamplingParams(temperature=0, max_tokens=256)
    eng.add_request(prompt, SamplingParams(temperature=0, max_tokens=8))
    while eng.has_unfinished_requests():
        eng.step()
    times, counts = defaultdict(float), defaultdict(int)
    for name in ('_schedule', '_draft', '_postprocess', '_finish', '_finish_drafts', '_finish_inflight'):
        if hasattr(eng, name):
            wrap(eng, name, times, counts)
    for name in ('host_batch', 'sampling_batch', 'run_batch', 'launch_batch'):
        wrap(eng.runner, name, times, counts)
    if eng.runner.graphs is not None:
        wrap(eng.runner.graphs, 'run', times, counts)
    for _ in range(batch):
        eng.add_request(prompt, params)
    steps, tokens, prof = 0, 0, None
    t0 = time.perf_counter()
    while eng.has_unfinished_requests():
        if trace and steps == 5:
            prof = torch.profiler.profile(with_stack=False)
            prof.start()
        for o in eng.step():
            if o.finished:
                tokens += len(o.outputs[0].token_ids)
        steps += 1
        if prof is not None and steps == 25:
            stop_trace(prof, f'{trace}/trace_k{k}_b{batch}.json.gz')
            prof = None
    if prof is not None:  # (a run of fewer steps)
        stop_trace(prof, f'{trace}/trace_k{k}_b{batch}.json.gz')
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    out = dict(k=k, batch=batch, steps=steps, tokens=tokens, wall_ms_per_step=wall * 1e3 / steps,
               ms_per_token=wall * 1e3 / tokens * batch, spec=eng.stats().spec_decode,
               ms_per_step={n: times[n] * 1e3 / steps for n in times}, calls=dict(counts))
    del eng
    torch.cuda.empty_cache()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--ks', default='0,4,8')
    ap.add_argument('--batch', type=int, default=1)
    ap.add_argument('--out', default=None)
    ap.add_argument('--trace', default=None, help='a folder for torch profiler traces of steps 5-24')
    a = ap.parse_args()
    res = [profile(int(k), a.batch, a.trace) for k in a.ks.split(',')]
    for r in res:
        print(json.dumps({x: (round(v, 3) if isinstance(v, float) else v) for x, v in r.items() if x != 'ms_per_step'}))
        print('   ', {n: round(v, 3) for n, v in r['ms_per_step'].items()})
    if a.out:
        with open(a.out, 'w') as f:
            json.dump(res, f, indent=1)


if __name__ == '__main__':
    main()
