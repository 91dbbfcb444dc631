"""Micro-benchmarks of three host-side pieces at batch 256, on the CPU, for whichever paged_infer is on the path:

    python kernels/micro_host.py [--tokenizer DIR] [--out FILE]   # this checkout; default out: kernels/results/host_micro/cpu/micro.jsonl
    PYTHONPATH=/path/to/other/checkout python kernels/micro_host.py --out micro_other.jsonl   # a checkout with the same module layout

build_metadata (256 decodes, tables of 37 blocks), SamplingBatch.from_params (256 greedy rows), and the incremental
detokenizer per token (64 sequences of 256 tokens after 500-token prompts; FINAL_ONLY requests are deferred where
the package has `defer`). Median of 5 repeats, each a mean over many calls; prints one JSON line and appends it to --out.
"""
import argparse, inspect, json, random, statistics, time
from pathlib import Path

import paged_infer
from paged_infer.ops.attention import build_metadata
from paged_infer.model.default_model import prepare_default_model
from paged_infer.core.detokenizer import IncrementalDetokenizer
from paged_infer.ops.sampler import SamplingBatch
from paged_infer.core.sampling_params import SamplingParams
from transformers import AutoTokenizer


def per_call(fn, n):
    fn()
    t0 = time.perf_counter()
    for _ in range(n): fn()
    return (time.perf_counter() - t0) / n


def main():
    ap = argparse.ArgumentParser(description='Micro-benchmarks of three host-side pieces at batch 256, on the CPU.')
    ap.add_argument('--tokenizer', default=None, help='a tokenizer folder (default: the default model\'s, under ~/.cache/paged-infer)')
    ap.add_argument('--out', default=str(Path(__file__).resolve().parent / 'results' / 'host_micro' / 'cpu' / 'micro.jsonl'), help='JSON-lines file the result is appended to')
    a = ap.parse_args()
    tables, ctx, q = [list(range(i * 40, i * 40 + 37)) for i in range(256)], [580] * 256, [1] * 256
    ps = [SamplingParams(temperature=0, max_tokens=500, ignore_eos=True) for _ in range(256)]
    prompts, outs = [list(range(500))] * 256, [list(range(100))] * 256
    tok = AutoTokenizer.from_pretrained(a.tokenizer or prepare_default_model())
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
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    with open(a.out, 'a') as f: f.write(json.dumps(res) + '\n')


if __name__ == '__main__':
    main()
