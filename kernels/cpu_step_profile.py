"""Where a decode step's time goes on a CPU: the engine on the default model, `--seqs` requests of 32 to 256 random
prompt tokens prefilled, then decode steps timed (wall clock), then a few more under the torch profiler, whose top
operators are printed (self CPU time, all steps together).

    python kernels/cpu_step_profile.py [--seqs 57] [--steps 10] [--dtype auto] [--plain]

The engine applies chapter 11c on a CPU (`use_cpu_linears`: projections stacked, weights packed for oneDNN);
`--plain` keeps its float linear layers `nn.Linear`, as `load_model` makes them, to see what the packing buys.
"""
import argparse
import random
import time

from torch.profiler import ProfilerActivity, profile

from paged_infer.core.config import EngineConfig
import paged_infer.core.engine as engine_module
from paged_infer.core.engine import LLMEngine
from paged_infer.core.sampling_params import SamplingParams
from paged_infer.model.default_model import default_model_dir
from paged_infer.worker.cpu_linear import PackedLinear


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--seqs', type=int, default=57)
    p.add_argument('--steps', type=int, default=10)
    p.add_argument('--dtype', default='auto')
    p.add_argument('--plain', action='store_true', help="without chapter 11c's use_cpu_linears")
    a = p.parse_args()
    if a.plain:
        engine_module.use_cpu_linears = lambda model: model  # the layers as loaded
    engine = LLMEngine(EngineConfig(model=str(default_model_dir()), dtype=a.dtype))
    rng = random.Random(0)
    vocab = engine.model.config.vocab_size
    for _ in range(a.seqs):
        ids = [rng.randrange(100, vocab - 100) for _ in range(rng.randint(32, 256))]
        engine.add_request(ids, SamplingParams(max_tokens=200, ignore_eos=True, temperature=0))
    while engine.scheduler.waiting:  # prefill everything (chunked), then a few decode steps to settle
        engine.step()
    for _ in range(3):
        engine.step()
    t = time.perf_counter()
    for _ in range(a.steps):
        engine.step()
    step = (time.perf_counter() - t) / a.steps
    packed = any(isinstance(m, PackedLinear) for m in engine.model.modules())
    print(f'dtype {a.dtype}, {"packed" if packed else "plain"}: a decode step of {len(engine.scheduler.running)} '
          f'sequences {step * 1e3:.1f} ms (mean of {a.steps})')
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            engine.step()
    print('5 more steps under the profiler:')
    print(prof.key_averages().table(sort_by='self_cpu_time_total', row_limit=15))


if __name__ == '__main__':
    main()
