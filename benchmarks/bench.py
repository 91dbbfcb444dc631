"""`paged-infer bench ...` where the console script is not installed (the GPU machine): the same parser, the same code.

    PYTHONPATH=. python benchmarks/bench.py throughput --shape qwen2.5-0.5b --tokenizer .gpu_assets/tokenizer --backend hf ...

Everything lives in paged_infer.benchmark (nbs/17_benchmarks.ipynb); this file only forwards its arguments.
"""
import sys

from paged_infer.cli import main

if __name__ == '__main__':
    sys.exit(main(['bench', *sys.argv[1:]]))
