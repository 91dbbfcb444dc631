"""The host's side of an n-gram drafting step against a plain one, on the CPU, at batch 64.

    python kernels/spec_host_profile.py [--batch 64] [--steps 40]

The model of `profile_host.py` (the Qwen2.5-0.5B shape shrunk to one layer of width 64 and a 4,096-token vocabulary,
random weights, float32), so that the model's own time is small and a step is mostly the engine around it. Each
request's prompt is one random passage of 40 tokens said six times, greedy, 400 tokens; drafting is forced on
(`disable_when_slower=False`, k = 4). Prints the median step (ms) without drafts and with them, then where the steps'
time goes: the wall time of each of the engine's parts named in `PARTS`, per step, and its calls (a part's time
includes the parts it calls). Wall-clock timers, not a profiler: a profiler's overhead inflates small calls many
times. The default model's tokenizer folder is copied into the model's folder (`--tokenizer`).
"""
import argparse
import functools
import random
import time

from paged_infer.bench.workloads import make_random_model
from paged_infer.core import spec_decode
from paged_infer.core.engine import LLMEngine
from paged_infer.core.sampling_params import RequestOutputKind, SamplingParams
from paged_infer.ops.sampler import Sampler
from paged_infer.worker.model_runner import ModelRunner
from profile_host import TINY  # (kernels/ is on the path when this script runs)

SPEC = {'method': 'ngram', 'num_speculative_tokens': 4, 'prompt_lookup_max': 4, 'prompt_lookup_min': 2,
        'disable_when_slower': False}
PARTS = [(LLMEngine, n) for n in ('_schedule', '_draft', '_verify', '_finish_drafts', '_accept', '_postprocess',
                                  '_run', '_finish')]
PARTS += [(ModelRunner, n) for n in ('host_batch', 'launch_batch', 'sampling_batch', 'run_batch')]
PARTS += [(Sampler, '__call__'), (spec_decode.Speculator, 'propose'), (spec_decode, 'with_drafts')]
PARTS += [(spec_decode, 'ngram_propose_many')] if hasattr(spec_decode, 'ngram_propose_many') else []


def timed(owner, name: str, into: dict):
    "Wrap `owner.name` so that its calls add their wall time and count to `into[name]`; returns the way back."
    f = getattr(owner, name)

    @functools.wraps(f)
    def wrapper(*args, **kw):
        t0 = time.perf_counter()
        try:
            return f(*args, **kw)
        finally:
            t, n = into.get(name, (0.0, 0))
            into[name] = (t + time.perf_counter() - t0, n + 1)
    setattr(owner, name, wrapper)
    return lambda: setattr(owner, name, f)


def run(folder, spec, batch: int, steps: int, parts: dict | None = None) -> float:
    "Median seconds of `steps` steps after five, with `batch` requests running; with `parts`, the parts timed."
    eng = LLMEngine(model=str(folder), max_num_seqs=batch, num_gpu_blocks=4096, speculative_config=spec)
    rng = random.Random(0)
    params = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True, output_kind=RequestOutputKind.FINAL_ONLY)
    for _ in range(batch):
        eng.add_request([rng.randrange(100, 4000) for _ in range(40)] * 6, params)
    for _ in range(5):
        eng.step()
    undo = [timed(owner, name, parts) for owner, name in PARTS if hasattr(owner, name)] if parts is not None else []
    times = []
    try:
        for _ in range(steps):
            t0 = time.perf_counter()
            eng.step()
            times.append(time.perf_counter() - t0)
    finally:
        for u in undo:
            u()
    return sorted(times)[steps // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--batch', type=int, default=64)
    ap.add_argument('--steps', type=int, default=40)
    ap.add_argument('--tokenizer', default=None, help="a tokenizer folder (default: the default model's)")
    a = ap.parse_args()
    folder = make_random_model('qwen2.5-0.5b', tokenizer_folder=a.tokenizer, dtype='float32', max_model_len=4096,
                               seed=0, device='cpu', **TINY)
    plain = run(folder, None, a.batch, a.steps)
    drafting = run(folder, SPEC, a.batch, a.steps)
    print(f'batch {a.batch}: median step {plain * 1e3:.2f} ms plain, {drafting * 1e3:.2f} ms drafting (k = 4)')
    for name, spec in (('plain', None), ('drafting', SPEC)):
        parts = {}
        total = run(folder, spec, a.batch, a.steps, parts)
        print(f'\n{name} steps, timed parts (median step {total * 1e3:.2f} ms):')
        for part, (t, n) in sorted(parts.items(), key=lambda x: -x[1][0]):
            print(f'  {part:20s} {t / a.steps * 1e3:7.3f} ms a step  {n / a.steps:6.1f} calls a step')


if __name__ == '__main__':
    main()
