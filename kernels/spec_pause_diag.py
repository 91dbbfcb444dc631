"""How often the pause rule of n-gram speculation (chapter 13d) drafts at batch 64, and what its check costs a step.

    python kernels/spec_pause_diag.py [--model DIR --load-format dummy]

Two engines side by side, without drafts and with k = 4 (the engine's default rule), 64 open questions at once,
sampled at 0.8 with a seed each, 256 tokens each (`ignore_eos`), six rounds interleaved. Prints each round's output
tokens a second, steps and median step (ms) for both engines; then, for the drafting engine, how many steps the rule
chose to draft, the median time of `Speculator.active` (the rule and the drafts made aside), the mean step seconds it
holds for plain and drafting steps by batch size (bit length) and its gain.
"""
import argparse
import json
import sys
import time

import torch

from paged_infer.core.engine import LLMEngine
from paged_infer.core.sampling_params import SamplingParams

sys.path.insert(0, 'benchmarks')
from spec_decode import OPEN_ASKS, chat  # noqa: E402  (the benchmark's prompts)

ap = argparse.ArgumentParser()
ap.add_argument('--model', default=None, help='default: the default model')
ap.add_argument('--load-format', default='auto')
a = ap.parse_args()
spec = {'method': 'ngram', 'num_speculative_tokens': 4, 'prompt_lookup_max': 4, 'prompt_lookup_min': 2}
kw = dict(model=a.model, load_format=a.load_format, max_num_seqs=64, num_gpu_blocks=4096)
engs = {'none': LLMEngine(**kw), 'k=4': LLMEngine(**kw, speculative_config=spec)}
sp = engs['k=4'].speculator
stats = dict(modes=[], act=[])
orig = sp.active


def active(r):
    t0 = time.perf_counter()
    w = orig(r)
    stats['act'].append(time.perf_counter() - t0)
    stats['modes'].append(w)
    return w


sp.active = active
prompts = [chat(engs['none'].tokenizer, OPEN_ASKS[i % len(OPEN_ASKS)]) for i in range(64)]
res = {n: [] for n in engs}
for rep in range(6):
    for n, e in engs.items():
        t0 = time.perf_counter()
        for i, p in enumerate(prompts):
            e.add_request(p, SamplingParams(temperature=0.8, seed=i, max_tokens=256, ignore_eos=True), f'{rep}-{i}')
        steps = 0
        st = []
        while e.has_unfinished_requests():
            t1 = time.perf_counter()
            e.step()
            st.append(time.perf_counter() - t1)
            steps += 1
        torch.cuda.synchronize()
        res[n].append((round(64 * 256 / (time.perf_counter() - t0)), steps, round(sorted(st)[len(st) // 2] * 1e3, 3)))
print(json.dumps(res))
m = stats['modes']
ms = [{k: round(v * 1e3, 3) for k, v in t.items()} for t in sp.seconds]
print('drafting-mode steps', sum(m), 'of', len(m), 'active() median us', sorted(stats['act'])[len(m) // 2] * 1e6,
      'seconds', *ms, 'gain', sp.gain)
