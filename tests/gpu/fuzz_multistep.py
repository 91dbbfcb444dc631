"""Differential fuzz of multi-step scheduling on the CPU, for as long as you like (the test suite runs a few cases:
tests/test_multistep_fuzz.py). Random workloads run with one decode step per schedule and with K (2, 3, 4 or 8) must
give the same outputs, while every launch writes only into blocks its sequence owns alone and that are not cached.

    python tests/gpu/fuzz_multistep.py [--seed 0] [--seconds 500]

Prints one line per case ('ok', 'DIFF' with the first differences, or 'ERROR' with a traceback).
Uses the default model (SmolLM2-135M, converted under ~/.cache/paged-infer on first use). No GPU needed.
"""
import argparse
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/

from test_multistep_fuzz import run_case  # noqa: E402

ap = argparse.ArgumentParser(description='Multi-step scheduling against one step at a time on random workloads (CPU).')
ap.add_argument('--seed', type=int, default=0, help='the first case; cases count up from it')
ap.add_argument('--seconds', type=float, default=500, help='stop starting new cases after this long')
args = ap.parse_args()
t0, seed = time.time(), args.seed
while time.time() - t0 < args.seconds:
    try:
        cfg, diffs = run_case(seed)
        print(seed, cfg, 'DIFF' if diffs else 'ok', diffs[:2], flush=True)
    except Exception as e:
        traceback.print_exc()
        print(seed, 'ERROR', repr(e), flush=True)
    seed += 1
