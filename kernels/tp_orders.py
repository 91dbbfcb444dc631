"""What an order from rank 0 to the other ranks costs: a gloo broadcast of the pickled order against chapter 18's
shared-memory `OrderQueue`; and, with --engine, tensor parallelism on the CPU end to end.

    python kernels/tp_orders.py [--orders 300] [--seqs 256] [--engine]

Orders: first the time to pickle and unpickle one; then two processes on this machine, gloo. Each order is a
`HostBatch` of `--seqs` decodes (16 blocks each), followed by one all-reduce of 576 floats, as a step's first
collective follows its order. Prints the milliseconds per order and all-reduce, for each transport, twice in turn.

--engine: a random Llama (8 query heads over 2 KV heads, 12 layers, hidden 512, the default model's tokenizer) in the
engine with tensor_parallel_size=2 on the CPU, 16 requests of 48 greedy tokens; prints output tokens a second. Run it
at two commits to compare transports.
"""
import argparse
import pickle
import shutil
import socket
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from paged_infer.worker.model_runner import HostBatch


def order(seqs: int) -> HostBatch:
    tables = [list(range(i * 16, i * 16 + 16)) for i in range(seqs)]
    pos = [300 + i for i in range(seqs)]
    return HostBatch(list(range(seqs)), pos, pos, [1] * seqs, tables, list(range(seqs)))


def side(rank: int, port: int, transport: str, queue: str | None, orders: int, seqs: int, out):
    from paged_infer.worker.tensor_parallel import OrderQueue

    torch.set_num_threads(1)
    dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{port}', rank=rank, world_size=2)
    q = OrderQueue(1, *queue) if transport == 'shm' and rank else None
    b, x = order(seqs), torch.ones(576)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(orders):
        if transport == 'gloo':
            msg = [('run_batch', b)] if rank == 0 else [None]
            dist.broadcast_object_list(msg, src=0)
        elif rank == 0:
            out.put(('run_batch', b))
        else:
            q.get(0)
        dist.all_reduce(x)
    dist.barrier()
    seconds = time.perf_counter() - t0
    if q is not None:
        q.close()
    dist.destroy_process_group()
    return seconds


def one(transport: str, orders: int, seqs: int) -> float:
    from paged_infer.worker.tensor_parallel import OrderQueue

    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    q = OrderQueue(1) if transport == 'shm' else None
    handle = (q.shm.name, q.wakeups) if q is not None else None
    p = mp.get_context('spawn').Process(target=side, args=(1, port, transport, handle, orders, seqs, None))
    p.start()
    seconds = side(0, port, transport, None, orders, seqs, q)
    p.join()
    if q is not None:
        q.close(unlink=True)
    return 1e3 * seconds / orders


def engine_run():
    from transformers import LlamaConfig, LlamaForCausalLM

    from paged_infer.bench.workloads import TOKENIZER_FILES
    from paged_infer.core.engine import LLMEngine
    from paged_infer.core.sampling_params import SamplingParams
    from paged_infer.model.default_model import prepare_default_model

    folder = Path(tempfile.mkdtemp()) / 'llama'
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=512, intermediate_size=1536, num_hidden_layers=12,
                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=2048)
    LlamaForCausalLM(cfg).save_pretrained(folder)
    for name in TOKENIZER_FILES:
        if (prepare_default_model() / name).is_file():
            shutil.copy(prepare_default_model() / name, folder / name)
    eng = LLMEngine(model=str(folder), tensor_parallel_size=2, num_gpu_blocks=256, device='cpu')
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    for rounds in range(2):
        for i in range(16):
            eng.add_request(f'Request {i}: tell me about the number {i * 37}.', params)
        t0, n = time.perf_counter(), 0
        while eng.has_unfinished_requests():
            n += sum(1 for o in eng.step() if o.finished) * 48
        rate = n / (time.perf_counter() - t0)
        if rounds:
            print(f'tensor_parallel_size=2, CPU: {rate:.1f} output tokens a second', flush=True)
    eng.shutdown()
    shutil.rmtree(folder.parent)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--orders', type=int, default=300)
    ap.add_argument('--seqs', type=int, default=256)
    ap.add_argument('--engine', action='store_true')
    a = ap.parse_args()
    if a.engine:
        return engine_run()
    b = order(a.seqs)
    data = pickle.dumps(('run_batch', b), protocol=pickle.HIGHEST_PROTOCOL)
    for name, f in (('pickle', lambda: pickle.dumps(('run_batch', b), protocol=pickle.HIGHEST_PROTOCOL)),
                    ('unpickle', lambda: pickle.loads(data))):
        t0 = time.perf_counter()
        for _ in range(200):
            f()
        print(f'{name} an order of {a.seqs} decodes ({len(data)} bytes): {(time.perf_counter() - t0) / 0.2:.3f} ms')
    for transport in ('gloo', 'shm', 'gloo', 'shm'):
        print(f'{transport}: {one(transport, a.orders, a.seqs):.3f} ms per order and all-reduce', flush=True)


if __name__ == '__main__':
    main()
