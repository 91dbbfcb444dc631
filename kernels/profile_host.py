"""The host's side of a decode step at batch 256, on the CPU: the work `profile_step.py` times on the GPU, without a GPU.

    python kernels/profile_host.py [--batch 256] [--context 512] [--steps 60] [--modes sync,async] \
        [--cprofile 25] [--out FILE]   # default: ./profile_host.json

The Qwen2.5-0.5B shape (its model type and vocabulary-independent structure) shrunk to one layer of width 64 and a
4,096-token vocabulary, random weights, float32 on the CPU: the model's own time becomes small, and what is left of
a step is what the engine does around the model on any machine: scheduling, the flat batch (`host_batch`), the
sampling batch, the tensors and attention metadata (`to_device`), the sampler's launches, and the postprocessing
(bookkeeping, stop checks, detokenization, outputs). `batch` requests of `context` random tokens are prefilled,
then decode steps run; each phase is timed with perf_counter (median over the steps, ms), with FINAL_ONLY outputs
and greedy sampling as in the throughput benchmark. On a GPU, `to_device` and the forward are replaced by the CUDA
graph path (`_decode_with_graph`), whose host side this script cannot time; everything else runs the same code.
With --cprofile N, the N functions with the most own time over the timed steps (cProfile: its overhead inflates
small functions, so read it as a ranking, not as times).
A mode `multiK` (e.g. `multi8`) is async scheduling with K decode steps per launch (`num_scheduler_steps`); every
row has `per_token_ms` (each phase's total over the decode steps run) and `host_ms_per_token` (the steps' time less
the model's forward and logits, per decode step), which compare the modes per generated token.
Each mode's row also has `cpu_probe_ms`, a fixed pure-Python workload timed before and after its steps: the host's
speed then, so that a slow host can be told from a slow change.
"""
import argparse, cProfile, io, json, pstats, statistics, time
from collections import defaultdict
from pathlib import Path

import torch

from paged_infer.worker import model_runner as mr
from paged_infer.bench.offline import machine_info
from paged_infer.bench.workloads import make_random_model
from paged_infer.core.engine import LLMEngine
from paged_infer.core.sampling_params import RequestOutputKind, SamplingParams
from profile_step import cpu_probe_ms, timed  # (kernels/ is on the path when this script runs)

TINY = dict(num_hidden_layers=1, hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1,
            vocab_size=4096)


def main():
    ap = argparse.ArgumentParser(description='The host side of a decode step on the CPU.')
    ap.add_argument('--batch', type=int, default=256)
    ap.add_argument('--context', type=int, default=512)
    ap.add_argument('--steps', type=int, default=60)
    ap.add_argument('--modes', default='sync,async')
    ap.add_argument('--cprofile', type=int, default=0)
    ap.add_argument('--out', default='profile_host.json', help='JSON file (default: ./profile_host.json)')
    a = ap.parse_args()
    torch.set_num_threads(1)  # the host's work is one thread; the tiny model's forward does not need more
    folder = make_random_model('qwen2.5-0.5b', dtype='float32', max_model_len=4096, seed=0, device='cpu', **TINY)
    res = dict(kind='host_profile', machine=machine_info(), batch=a.batch, context=a.context, steps=a.steps, model=TINY, modes=[])
    for mode in a.modes.split(','):
        eng = LLMEngine(model=str(folder), device='cpu', max_num_seqs=a.batch, max_num_batched_tokens=8192, max_model_len=4096,
                        kv_cache_memory_gb=0.5, async_scheduling=mode != 'sync',
                        num_scheduler_steps=int(mode[5:]) if mode.startswith('multi') else 1)  # 'multi8': async, 8 steps a launch
        r, V = eng.runner, eng.model.config.vocab_size
        g = torch.Generator().manual_seed(0)
        for i in range(a.batch):
            eng.add_request(torch.randint(0, V, (a.context,), generator=g).tolist(),
                            SamplingParams(temperature=0, max_tokens=4096 - a.context - 8, ignore_eos=True,
                                           output_kind=RequestOutputKind.FINAL_ONLY))
        while eng.scheduler.waiting or any(s.num_output_tokens == 0 for gr in eng.scheduler.running for s in gr.seqs): eng.step()
        for _ in range(3): eng.step()  # settle
        t = defaultdict(list)
        patches = [(eng.scheduler, 'schedule'), (r, 'host_batch'), ((r, 'sampling_batch') if hasattr(r, 'sampling_batch') else (mr.SamplingBatch, 'from_params')), (r, 'to_device'),
                   (r.model, 'forward'), (r.model, 'compute_logits'), (r, 'sampler'), (eng, '_postprocess')]
        saved = [(o, k, getattr(o, k)) for o, k in patches]
        names = {'from_params': 'sampling_batch', 'forward': 'model_forward'}
        for o, k, f in saved: setattr(o, k, timed(t, names.get(k, k), f))
        steps, probe, decode_steps = [], [cpu_probe_ms()], 0
        for _ in range(a.steps):
            t0 = time.perf_counter(); eng.step(); steps.append(time.perf_counter() - t0)
            f = eng.inflight.out if eng.inflight is not None else None  # (sync: the step just run is gone; one step)
            decode_steps += max(f.num_steps) if f is not None and f.num_steps else 1
        probe.append(cpu_probe_ms())
        for o, k, f in saved: setattr(o, k, f)
        prof = None
        if a.cprofile:
            p = cProfile.Profile(); p.enable()
            for _ in range(a.steps): eng.step()
            p.disable(); s = io.StringIO()
            pstats.Stats(p, stream=s).sort_stats('tottime').print_stats(a.cprofile); prof = s.getvalue()
        med = lambda xs: statistics.median(xs) * 1e3 if xs else 0.0
        ph = {k: med(v) for k, v in t.items()}
        device_like = ph.get('model_forward', 0) + ph.get('compute_logits', 0)  # what a GPU would run
        per_token = {k: sum(v) * 1e3 / decode_steps for k, v in t.items()}  # each phase's total over the decode steps run
        row = dict(mode=mode, step_ms=med(steps), phases_ms=ph, host_ms=med(steps) - device_like, cpu_probe_ms=probe,
                   running=sum(len(gr.seqs) for gr in eng.scheduler.running), decode_steps=decode_steps,
                   per_token_ms=per_token, step_ms_per_token=sum(steps) * 1e3 / decode_steps,
                   host_ms_per_token=(sum(steps) * 1e3 - sum(sum(t.get(k, [])) * 1e3 for k in ('model_forward', 'compute_logits'))) / decode_steps)
        print(json.dumps(row), flush=True)
        if prof: print(prof)
        res['modes'].append(row | dict(cprofile=prof))
        del eng, r, saved, patches
    if a.out: Path(a.out).parent.mkdir(parents=True, exist_ok=True); Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == '__main__':
    main()
