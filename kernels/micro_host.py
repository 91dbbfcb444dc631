"""Micro-benchmarks of three host-side pieces at batch 256, on the CPU, for whichever paged_infer is on the path:

    python kernels/micro_host.py            # this checkout
    PYTHONPATH=/path/to/other/checkout python kernels/micro_host.py

build_metadata (256 decodes, tables of 37 blocks), SamplingBatch.from_params (256 greedy rows), and the incremental
detokenizer per token (64 sequences of 256 tokens after 500-token prompts; FINAL_ONLY requests are deferred where
the package has `defer`). Median of 5 repeats, each a mean over many calls; prints one JSON line.
"""
import inspect, json, random, statistics, time

import paged_infer
from paged_infer.attention import build_metadata
from paged_infer.default_model import prepare_default_model
from paged_infer.detokenizer import IncrementalDetokenizer
from paged_infer.sampler import SamplingBatch
from paged_infer.sampling_params import SamplingParams
from transformers import AutoTokenizer


def per_call(fn, n):
    fn()
    t0 = time.perf_counter()
    for _ in range(n): fn()
    return (time.perf_counter() - t0) / n


def main():
    tables, ctx, q = [list(range(i * 40, i * 40 + 37)) for i in range(256)], [580] * 256, [1] * 256
    ps = [SamplingParams(temperature=0, max_tokens=500, ignore_eos=True) for _ in range(256)]
    prompts, outs = [list(range(500))] * 256, [list(range(100))] * 256
    tok = AutoTokenizer.from_pretrained(prepare_default_model())
    rng = random.Random(0)
    seqs = [([rng.randrange(len(tok)) for _ in range(500)], [rng.randrange(len(tok)) for _ in range(256)]) for _ in range(64)]
    defer = 'defer' in inspect.signature(IncrementalDetokenizer).parameters

    def detok():
        for p, o in seqs:
            d = IncrementalDetokenizer(tok, p, defer=True) if defer else IncrementalDetokenizer(tok, p)
            for t in o: d.step([t])
            d.flush()
    med = lambda f, n: statistics.median(per_call(f, n) for _ in range(5))
    res = dict(package=paged_infer.__file__, deferred_detokenizer=defer,
               build_metadata_ms=med(lambda: build_metadata(tables, ctx, q, 16, 'cpu'), 100) * 1e3,
               sampling_batch_ms=med(lambda: SamplingBatch.from_params(ps, prompts, outs, 4096, 2, [None] * 256, 'cpu'), 100) * 1e3,
               detokenize_us_per_token=med(detok, 1) / sum(len(o) for _, o in seqs) * 1e6)
    print(json.dumps(res))


if __name__ == '__main__':
    main()
