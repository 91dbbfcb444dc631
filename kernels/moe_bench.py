"""Check and time chapter 15f's fused mixture-of-experts layer on a CUDA GPU (bf16), against chapter 7b's grouped torch
layer and, where vLLM imports, against vLLM's fused_experts.

    python kernels/moe_bench.py --out DIR [--shapes qwen3-30b-a3b,mixtral-8x7b] [--tokens 1,16,64,256,1024,4096]
                                [--sweep] [--vllm] [--tuned FILE]

1. checks, on fresh random inputs for each shape and several token counts: the layout of the three Triton kernels
   against the torch one; fused_moe and moe_grouped, both bf16, against moe_grouped on float32 copies of the same
   numbers (relative error ||out - ref|| / ||ref||); a CUDA graph captured around fused_moe, replayed on new routings,
   against eager; the CUDA kernels one call launches (torch.profiler).
2. timings: each timed call a CUDA-graph replay of 8 calls over 8 different layers' weights (so the L2 cache does not
   hold the weights from one call to the next), CUDA events, median of 10 replays; the memory floor: the bytes of the
   experts that the routing touches, read once at the rate a reduction reads a 4 GiB buffer here.
3. --sweep: a set of tile configurations for each token count; the best is written to DIR/moe_configs.json, the table
   that PAGED_INFER_MOE_CONFIGS reads (chapter 15f); --tuned FILE times fused_moe with that table.
Writes DIR/moe_bench.json (everything) and prints a table.
"""
import argparse, json, os, statistics, sys, time
from pathlib import Path

import torch

SHAPES = {  # experts, top-k, hidden, intermediate (per expert), renormalize
    'qwen3-30b-a3b': (128, 8, 2048, 768, True),
    'mixtral-8x7b': (8, 2, 4096, 14336, True),
}
CONFIGS = [dict(BLOCK_M=m, BLOCK_N=n, BLOCK_K=k, GROUP_M=gm, num_warps=w, num_stages=s) for m, n, k, gm, w, s in (
    (16, 64, 128, 1, 4, 4), (16, 128, 128, 1, 4, 3), (16, 64, 64, 1, 4, 3), (32, 64, 128, 1, 4, 4),
    (32, 128, 64, 8, 4, 3), (64, 64, 64, 8, 4, 3), (64, 128, 64, 8, 4, 3), (64, 128, 64, 8, 8, 4),
    (64, 256, 64, 8, 8, 3), (128, 128, 64, 8, 8, 3), (128, 128, 64, 16, 8, 4), (128, 256, 64, 8, 8, 3))]
LAYERS = 8


def graph_time(fn, n_calls: int, replays: int = 10) -> float:
    "Microseconds per call: fn(i) for i < n_calls captured in one CUDA graph, median over replays."
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(n_calls):
            fn(i)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(n_calls):
            fn(i)
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / n_calls)
    return statistics.median(times)


def read_tbps() -> float:
    "Bytes per second (TB/s) a reduction reads of a 4 GiB bf16 buffer: the rate the experts' weights can be read at."
    x = torch.randn(2 << 30, dtype=torch.bfloat16, device='cuda')
    us = graph_time(lambda i: x.sum(), 4)
    return 2 * x.numel() / (us * 1e-6) / 1e12


def layer_weights(E, H, I, seed):
    g = torch.Generator('cuda').manual_seed(seed)
    w13 = (torch.randn(E, 2 * I, H, generator=g, device='cuda') / H**0.5).bfloat16()
    w2 = (torch.randn(E, H, I, generator=g, device='cuda') / I**0.5).bfloat16()
    return w13, w2


def routing(T, E, k, renorm, seed):
    from paged_infer.model.moe import route
    g = torch.Generator('cuda').manual_seed(seed)
    x = torch.randn(T, SHAPE_H, generator=g, device='cuda').bfloat16()
    weights, ids = route(torch.randn(T, E, generator=g, device='cuda'), k, renorm)
    return x, weights, ids


def pairs_by_expert(layout, bm, P) -> list:
    "Sorted (expert, pair) of the slots in use: the atomics order pairs within an expert's group as they like."
    sorted_ids, expert_ids, total = (t.cpu().long() for t in layout)
    owner = expert_ids.repeat_interleave(bm)
    real = sorted_ids < P
    return sorted(zip(owner[real].tolist(), sorted_ids[real].tolist()))


def rel_err(out, ref) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def kernels_launched(fn) -> int:
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(e.count for e in prof.key_averages() if e.device_type.name == 'CUDA' and 'Memcpy' not in e.key
               and 'Memset' not in e.key)


def main():
    global SHAPE_H
    ap = argparse.ArgumentParser()
    ap.add_argument('--out', required=True)
    ap.add_argument('--shapes', default=','.join(SHAPES))
    ap.add_argument('--tokens', default='1,16,64,256,1024,4096')
    ap.add_argument('--sweep', action='store_true')
    ap.add_argument('--vllm', action='store_true', help="also time vLLM's fused_experts (vllm must import)")
    ap.add_argument('--tuned', default=None, help='a moe_configs.json to time fused_moe with')
    a = ap.parse_args()
    if a.tuned:
        os.environ['PAGED_INFER_MOE_CONFIGS'] = a.tuned
    from paged_infer.model.moe import moe_grouped
    from paged_infer.model.moe import route
    from paged_infer.ops.fused_moe import align_by_expert, align_by_expert_ref, fused_moe, moe_config, route_triton
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tokens = [int(t) for t in a.tokens.split(',')]
    res = dict(gpu=torch.cuda.get_device_name(0), torch=torch.__version__, date=time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime()),
               command=' '.join(sys.argv), read_TBps=round(read_tbps(), 3), checks=[], times=[], sweep=[], graph=[], launches={})
    vllm_experts = None
    if a.vllm:
        try:
            from vllm.model_executor.layers.fused_moe import fused_experts as vllm_experts
            import vllm
            res['vllm'] = vllm.__version__
        except Exception as e:  # noqa: BLE001
            res['vllm'] = f'not imported: {type(e).__name__}: {e}'[:300]
    print('read', res['read_TBps'], 'TB/s', res.get('vllm', ''), flush=True)
    best = {}
    for name in a.shapes.split(','):
        E, k, H, I, renorm = SHAPES[name]
        SHAPE_H = H
        layers = [layer_weights(E, H, I, seed) for seed in range(LAYERS)]
        # 1. checks
        logits = torch.randn(4096, E, device='cuda').bfloat16()
        w_ref, i_ref = route(logits, k, renorm)
        w_out, i_out = route_triton(logits, k, renorm)
        res['checks'].append(dict(shape=name, router_tokens=4096, same_experts=float((i_out.long() == i_ref).all(1).float().mean()),
                                  max_weight_err=(w_out - w_ref).abs().max().item()))
        print('check', res['checks'][-1], flush=True)
        for T in (1, 7, 64, 300):
            x, weights, ids = routing(T, E, k, renorm, 100 + T)
            w13, w2 = layers[0]
            for bm in (16, 64):
                lay, ref_lay = align_by_expert(ids, E, bm), align_by_expert_ref(ids, E, bm)
                assert torch.equal(lay[1], ref_lay[1]) and torch.equal(lay[2], ref_lay[2]), 'layout'
                assert pairs_by_expert(lay, bm, ids.numel()) == pairs_by_expert(ref_lay, bm, ids.numel()), 'each expert holds the same pairs'
            ref = moe_grouped(x.float(), w13.float(), w2.float(), weights, ids)
            ours = fused_moe(x, w13, w2, weights, ids)
            grouped = moe_grouped(x, w13, w2, weights, ids)
            row = dict(shape=name, tokens=T, fused_rel_err=rel_err(ours, ref), grouped_bf16_rel_err=rel_err(grouped, ref),
                       nan=bool(ours.isnan().any()))
            if vllm_experts is not None:
                try:
                    row['vllm_rel_err'] = rel_err(vllm_experts(x, w13, w2, weights, ids.int()), ref)
                except Exception as e:  # noqa: BLE001
                    row['vllm_rel_err'] = f'{type(e).__name__}: {e}'[:200]
            res['checks'].append(row)
            print('check', row, flush=True)
        # CUDA graph: captured once, replayed on new routings
        T = 8
        x, weights, ids = routing(T, E, k, renorm, 7)
        w13, w2 = layers[0]
        sx, sw, si = x.clone(), weights.clone(), ids.clone()
        fused_moe(sx, w13, w2, sw, si)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            so = fused_moe(sx, w13, w2, sw, si)
        worst = 0.0
        for seed in range(5):
            x, weights, ids = routing(T, E, k, renorm, 1000 + seed)
            sx.copy_(x), sw.copy_(weights), si.copy_(ids)
            g.replay()
            worst = max(worst, (so.float() - fused_moe(x, w13, w2, weights, ids).float()).abs().max().item())
        res['graph'].append(dict(shape=name, tokens=T, replays=5, max_abs_diff_vs_eager=worst))
        print('graph', res['graph'][-1], flush=True)
        try:
            res['launches'][name] = kernels_launched(lambda: fused_moe(x, w13, w2, weights, ids))
        except Exception as e:  # noqa: BLE001
            res['launches'][name] = f'{type(e).__name__}: {e}'[:200]
        print('launches', res['launches'][name], flush=True)
        # 2. timings (and 3. the sweep)
        for T in tokens:
            x, weights, ids = routing(T, E, k, renorm, 5)
            busy = int((torch.bincount(ids.flatten(), minlength=E) > 0).sum())
            floor_us = busy * 3 * H * I * 2 / (res['read_TBps'] * 1e12) * 1e6  # each busy expert read once
            row = dict(shape=name, tokens=T, busy_experts=busy, floor_us=round(floor_us, 2))
            row['fused_us'] = graph_time(lambda i: fused_moe(x, *layers[i % LAYERS], weights, ids), LAYERS)
            row['fused_config'] = moe_config(T, E, H, I)
            if T <= 1024:
                row['grouped_eager_us'] = eager_time(lambda i: moe_grouped(x, *layers[i % LAYERS], weights, ids), LAYERS)
            if vllm_experts is not None:
                ids32 = ids.int()
                try:
                    row['vllm_us'] = graph_time(lambda i: vllm_experts(x, *layers[i % LAYERS], weights, ids32), LAYERS)
                except Exception as e:  # noqa: BLE001
                    row['vllm_us'] = f'{type(e).__name__}: {e}'[:200]
            if a.sweep:
                times = []
                for cfg in CONFIGS:
                    try:
                        us = graph_time(lambda i: fused_moe(x, *layers[i % LAYERS], weights, ids, config=cfg), LAYERS, 5)
                    except Exception as e:  # noqa: BLE001
                        us = float('inf')
                        print('config failed', cfg, type(e).__name__, str(e)[:120], flush=True)
                    times.append(us)
                    res['sweep'].append(dict(shape=name, tokens=T, config=cfg, us=us))
                j = min(range(len(CONFIGS)), key=times.__getitem__)
                best.setdefault(f'{E},{H},{I}', {})[str(T)] = CONFIGS[j]
                row['sweep_best_us'], row['sweep_best'] = times[j], CONFIGS[j]
            res['times'].append(row)
            print('time', row, flush=True)
        del layers
        torch.cuda.empty_cache()
        if best:  # after each shape: a run cut short keeps what it measured
            (out / 'moe_configs.json').write_text(json.dumps(best, indent=1))
        (out / 'moe_bench.json').write_text(json.dumps(res, indent=1))
    print(f"{'shape':15} {'T':>5} {'floor':>8} {'fused':>8} {'best':>8} {'grouped':>9} {'vllm':>8}  (us)")
    for r in res['times']:
        f = lambda v: f'{v:8.1f}' if isinstance(v, float) else f'{"-":>8}'
        print(f"{r['shape']:15} {r['tokens']:5} {f(r['floor_us'])} {f(r['fused_us'])} {f(r.get('sweep_best_us'))} "
              f"{f(r.get('grouped_eager_us'))} {f(r.get('vllm_us'))}")


def eager_time(fn, n_calls: int, reps: int = 3) -> float:
    "Microseconds per call, eager (moe_grouped reads counts on the host: no graph can hold it)."
    for i in range(n_calls):
        fn(i)
    torch.cuda.synchronize()
    t = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for i in range(n_calls):
            fn(i)
        torch.cuda.synchronize()
        t.append((time.perf_counter() - t0) * 1e6 / n_calls)
    return statistics.median(t)


SHAPE_H = 0
if __name__ == '__main__':
    main()
