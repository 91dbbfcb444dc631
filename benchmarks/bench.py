"""`paged-infer bench ...` where the console script is not installed: the same parser, the same code, and an output folder.

    PYTHONPATH=. python benchmarks/bench.py [--out-dir DIR] throughput|latency|serving [bench flags] [--out NAME.json]

The result goes to DIR/NAME.json. Without `--out-dir`, DIR is `benchmarks/results/<what>/<machine>`: <what> is the
bench command (throughput, latency, serving) and <machine> is `h200` on an NVIDIA H200, the GPU's name in lower case
on another GPU, else `cpu`. Without `--out`, NAME comes from the flags that tell runs apart:
`<model or shape>_<workload>[_s<scale>]_n<requests>[_vs-hf<batch sizes>|_vs-vllm]` for throughput (plus `_sync`,
`_eager`, `_tp<N>`, `_k<N>` where given), `..._rate<R>` for serving, `<model>_b<batch>_in<len>_out<len>[_vs-vllm]` for
latency.
An `--out` with a folder in it (`--out some/where/x.json`) is used as it is.

The commands live in paged_infer.bench.cli (nbs/17c_bench_cli.ipynb); this file only forwards its arguments.
"""
import argparse
import sys
from pathlib import Path

from paged_infer.entrypoints.cli import main

REPO = Path(__file__).resolve().parent.parent
KINDS = ('throughput', 'latency', 'serving')


def machine_name() -> str:
    "`h200` on an NVIDIA H200, the GPU's name in lower case on another GPU, else `cpu`."
    try:
        import torch
        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name().lower().replace('nvidia', '').strip()
            return 'h200' if 'h200' in gpu else '-'.join(gpu.split()) or 'gpu'
    except Exception:
        pass
    return 'cpu'


def result_name(kind: str, flags: list) -> str:
    "A file name from the flags that tell runs of `kind` apart (no dates, no run numbers)."
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for f, d in (('--model', None), ('--shape', None), ('--workload', 'sharegpt-like'), ('--num-requests', '256'),
                 ('--scale', '1'), ('--backend', 'engine'), ('--hf-batch-size', '16'), ('--request-rate', 'inf'),
                 ('--num-scheduler-steps', '1'), ('--batch-size', '8'), ('--input-len', '128'), ('--output-len', '32')):
        p.add_argument(f, default=d)
    p.add_argument('--tensor-parallel-size', '-tp', default='1')
    p.add_argument('--enforce-eager', action='store_true')
    p.add_argument('--no-async-scheduling', action='store_true')
    a, _ = p.parse_known_args(flags)
    model = a.shape or (Path(a.model).name.lower() if a.model else 'smollm2-135m')
    vllm = {'vllm': '_vs-vllm', 'vllm-only': '_vllm-only'}.get(a.backend, '')
    if kind == 'latency':
        return f'{model}_b{a.batch_size}_in{a.input_len}_out{a.output_len}{vllm}.json'
    name = f"{model}_{a.workload.removesuffix('-like')}" + (f'_s{a.scale}' if a.scale != '1' else '') + f'_n{a.num_requests}'
    if kind == 'serving':
        return f'{name}_rate{a.request_rate}.json'
    if vllm:
        name += vllm
    elif a.backend != 'engine':
        name += f"_{'hf-only' if a.backend == 'hf-only' else 'vs-hf'}{a.hf_batch_size.replace(',', '-')}"
    if a.no_async_scheduling: name += '_sync'
    if a.enforce_eager: name += '_eager'
    if a.tensor_parallel_size != '1': name += f'_tp{a.tensor_parallel_size}'
    if a.num_scheduler_steps != '1': name += f'_k{a.num_scheduler_steps}'
    return name + '.json'


def with_output(argv: list) -> list:
    "The bench arguments with `--out` resolved under the output folder (`--out-dir`, or the default one)."
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    p.add_argument('--out-dir', default=None)
    ours, rest = p.parse_known_args(argv)
    kind = next((a for a in rest if a in KINDS), None)
    if kind is None or any(a in ('-h', '--help') for a in rest):
        return rest  # let the bench parser print its usage or its error
    out_dir = Path(ours.out_dir) if ours.out_dir else REPO / 'benchmarks' / 'results' / kind / machine_name()
    q = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    q.add_argument('--out', default=None)
    given, _ = q.parse_known_args(rest)
    if given.out and Path(given.out).parent != Path('.'):
        return rest  # a path with a folder: as given
    name = given.out or result_name(kind, rest)
    rest = [a for i, a in enumerate(rest) if a != '--out' and not a.startswith('--out=') and not (i and rest[i - 1] == '--out')]
    return rest + ['--out', str(out_dir / name)]


if __name__ == '__main__':
    sys.exit(main(['bench', *with_output(sys.argv[1:])]))
