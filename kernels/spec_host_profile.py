"""The host's side of an n-gram drafting step against a plain one, on the CPU, at batch 64.

    python kernels/spec_host_profile.py [--batch 64] [--steps 40] [--top 12]

The model of `profile_host.py` (the Qwen2.5-0.5B shape shrunk to one layer of width 64 and a 4,096-token vocabulary,
random weights, float32), so that the model's own time is small and a step is mostly the engine around it. Each
request's prompt is one random passage of 40 tokens said six times, greedy, 400 tokens; drafting is forced on
(`disable_when_slower=False`, k = 4). Prints the median step (ms) without drafts and with them, and the functions
with the most own time over the drafting steps (cProfile: read it as a ranking; its overhead inflates small calls).
The default model's tokenizer folder is copied into the model's folder (`--tokenizer`).
"""
import argparse
import cProfile
import pstats
import random
import time

from paged_infer.bench.workloads import make_random_model
from paged_infer.core.engine import LLMEngine
from paged_infer.core.sampling_params import RequestOutputKind, SamplingParams
from profile_host import TINY  # (kernels/ is on the path when this script runs)

SPEC = {'method': 'ngram', 'num_speculative_tokens': 4, 'prompt_lookup_max': 4, 'prompt_lookup_min': 2,
        'disable_when_slower': False}


def run(folder, spec, batch: int, steps: int, prof: cProfile.Profile | None = None) -> float:
    "Median seconds of `steps` steps after five, with `batch` requests running."
    eng = LLMEngine(model=str(folder), max_num_seqs=batch, num_gpu_blocks=4096, speculative_config=spec)
    rng = random.Random(0)
    params = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True, output_kind=RequestOutputKind.FINAL_ONLY)
    for _ in range(batch):
        eng.add_request([rng.randrange(100, 4000) for _ in range(40)] * 6, params)
    for _ in range(5):
        eng.step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        if prof is not None:
            prof.enable()
        eng.step()
        if prof is not None:
            prof.disable()
        times.append(time.perf_counter() - t0)
    return sorted(times)[steps // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--batch', type=int, default=64)
    ap.add_argument('--steps', type=int, default=40)
    ap.add_argument('--top', type=int, default=12)
    ap.add_argument('--tokenizer', default=None, help="a tokenizer folder (default: the default model's)")
    a = ap.parse_args()
    folder = make_random_model('qwen2.5-0.5b', tokenizer_folder=a.tokenizer, dtype='float32', max_model_len=4096,
                               seed=0, device='cpu', **TINY)
    plain = run(folder, None, a.batch, a.steps)
    drafting = run(folder, SPEC, a.batch, a.steps)
    print(f'batch {a.batch}: median step {plain * 1e3:.2f} ms plain, {drafting * 1e3:.2f} ms drafting (k = 4)')
    prof = cProfile.Profile()
    run(folder, SPEC, a.batch, a.steps, prof)
    pstats.Stats(prof).sort_stats('tottime').print_stats(a.top)


if __name__ == '__main__':
    main()
