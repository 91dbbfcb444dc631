"""The memory an engine of the default model holds on a CPU: the process's anonymous memory (RssAnon: not the mapped
model file) after each of two engines is built, with the linear layers packed (chapter 11c) or plain (`--plain`).

    python kernels/cpu_engine_memory.py [--plain] [--engines 2]

Prints one line a stage, with the KV pool's and the swap pool's sizes as allocated (the swap pool's pages are only
the system's until blocks are swapped out).
"""
import argparse

import paged_infer.core.engine as engine_module
from paged_infer.core.config import EngineConfig
from paged_infer.core.engine import LLMEngine
from paged_infer.worker.cpu_linear import PackedLinear


def own_mb() -> int:
    "RssAnon of this process in MB (Linux)."
    for line in open('/proc/self/status'):
        if line.startswith('RssAnon'):
            return int(line.split()[1]) // 1024


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--plain', action='store_true', help="without chapter 11c's use_cpu_linears")
    p.add_argument('--engines', type=int, default=2)
    a = p.parse_args()
    if a.plain:
        engine_module.use_cpu_linears = lambda model: model
    print(f'start: {own_mb()} MB')
    engines = []
    for i in range(a.engines):
        engines.append(LLMEngine(EngineConfig()))
        r = engines[-1].runner
        packed = any(isinstance(m, PackedLinear) for m in engines[-1].model.modules())
        kv_mb = r.kv_cache.numel() * r.kv_cache.element_size() / 2**20
        swap_mb = r.cpu_cache.numel() * r.cpu_cache.element_size() / 2**20
        print(f'engine {i + 1} ({"packed" if packed else "plain"}): {own_mb()} MB of anonymous memory '
              f'(KV pool {kv_mb:.0f} MB, swap pool {swap_mb:.0f} MB allocated)')


if __name__ == '__main__':
    main()
