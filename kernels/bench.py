"""Check and time the Triton kernels of `paged_infer.ops` (cache_kernels, decode_attention, prefill_attention) on a CUDA GPU, side by side with torch SDPA (flash).

    python kernels/bench.py                          # on a GPU: results in kernels/results/triton_kernels/<machine>/
    python kernels/bench.py --smoke --out /tmp/smoke # tiny shapes on a CPU through Triton's interpreter
    python kernels/bench.py --summarize kernels/results/decode_attention/h200 --copy-TBps 4.29   # no GPU: see summarize()

1. ceilings: a device-to-device copy (bytes read + written over time) and a bf16 matrix product;
2. checks: every kernel against the torch reference on fresh random inputs in bf16, outputs poisoned with NaN,
   K/V slots that no sequence owns poisoned with NaN, relative error ||out - ref|| / ||ref|| (ref in float32);
3. timings with CUDA events (warm-up, median of many runs, the L2 cache flushed by reading a 512 MB buffer before each run; each timed call a CUDA-graph replay):
   decode (Llama-3-8B heads, block size 16) and prefill against SDPA's flash backend over a contiguous cache of the
   same shape, split counts and tile configurations swept, block copies against torch's indexed copies.
Writes OUT/{ceilings,checks,decode,decode_sweep,prefill,copy}.csv and prints a short table last.
`--summarize DIR` needs no GPU: it writes DIR/decode_summary.csv from a run's raw files (see summarize()).
"""
import argparse, csv, math, os, statistics, sys, time

SMOKE = '--smoke' in sys.argv
if SMOKE: os.environ['TRITON_INTERPRET'] = '1'  # before the kernels are defined

import torch
import torch.nn.functional as F
import triton

from paged_infer.ops.attention import build_metadata, paged_attention_ref, store_kv
from paged_infer.ops.cache_kernels import copy_blocks_triton, store_kv_triton
from paged_infer.ops.decode_attention import decode_num_splits, num_sms, paged_decode_attention
from paged_infer.ops.prefill_attention import paged_attention_triton, paged_prefill_attention

DEV = 'cpu' if SMOKE else 'cuda'
BF16 = torch.float32 if SMOKE else torch.bfloat16  # the interpreter's tl.dot is wrong in bf16
HQ, HKV, D, BS = (4, 2, 16, 4) if SMOKE else (32, 8, 128, 16)
NAN = float('nan')

# ---------------------------------------------------------------- timing
_flush = None

def bench(fn, rep_ms=60, quantiles=(0.2, 0.5, 0.8), write_flush=False, graph=True):
    """Milliseconds per call of fn at the given quantiles: CUDA events around each call, the L2 flushed before each.

    With `graph`, fn is captured once in a CUDA graph and its replays are timed: the engine runs decode steps that
    way, and it keeps the host's launch overhead (tens of microseconds for a Python wrapper) out of a GPU timing.
    """
    global _flush
    if SMOKE:
        t = time.perf_counter(); fn(); dt = (time.perf_counter() - t) * 1e3
        return [dt] * len(quantiles)
    if _flush is None: _flush = torch.ones(128 * 2**20, dtype=torch.float32, device=DEV)  # 512 MB, 8x the L2
    fn(); torch.cuda.synchronize()
    call = fn
    if graph:
        try:
            side = torch.cuda.Stream(); side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side): fn()
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g): fn()
            call = g.replay
        except Exception as ex:  # timed eagerly then; said in the log
            print(f'  (graph capture failed, timing eagerly: {type(ex).__name__}: {str(ex)[:120]})', flush=True)
            torch.cuda.synchronize()
    flush = (lambda: _flush.fill_(1.0)) if write_flush else _flush.sum  # a write leaves the L2 dirty: see NOTES.md
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(5): flush(); call()
    e.record(); torch.cuda.synchronize()
    est = max(s.elapsed_time(e) / 5 - 0.13, 1e-3)  # minus the flush, roughly
    n = int(min(max(rep_ms / est, 20), 1000))
    for _ in range(min(n // 5, 50)): call()  # warm-up
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for a, b in ev:
        flush()
        a.record(); call(); b.record()
    torch.cuda.synchronize()
    ts = sorted(a.elapsed_time(b) for a, b in ev)
    return [ts[min(int(q * len(ts)), len(ts) - 1)] for q in quantiles]

def med(fn, **kw): return bench(fn, **kw)[1]

def rel_err(out, ref): return ((out.float() - ref.float()).norm() / ref.float().norm()).item()

def sdpa(q, k, v, **kw):
    "SDPA on (B, H, L, D) views, the flash backend on a GPU."
    if SMOKE: return F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kw)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kw)

# ---------------------------------------------------------------- inputs
def paged_batch(ctx, qlen, bs, hq, hkv, d, dtype, seed, spare=8):
    "Queries and a paged pool in which every slot that no sequence owns holds NaN; block tables shuffled."
    g = torch.Generator(device=DEV).manual_seed(seed)
    lens = [c + q for c, q in zip(ctx, qlen)]
    need = [-(-L // bs) for L in lens]
    perm = torch.randperm(sum(need) + spare, device=DEV, generator=g)
    tables, at = [], 0
    for n in need: tables.append(perm[at:at + n].tolist()); at += n
    kc = torch.full((len(perm), bs, hkv, d), NAN, dtype=dtype, device=DEV)
    vc = torch.full_like(kc, NAN)
    slots = torch.cat([torch.tensor(t, device=DEV)[torch.arange(L, device=DEV) // bs] * bs + torch.arange(L, device=DEV) % bs
                       for t, L in zip(tables, lens)])
    kc.view(-1, hkv, d)[slots] = torch.randn(len(slots), hkv, d, device=DEV, generator=g).to(dtype)
    vc.view(-1, hkv, d)[slots] = torch.randn(len(slots), hkv, d, device=DEV, generator=g).to(dtype)
    q = torch.randn(sum(qlen), hq, d, device=DEV, generator=g).to(dtype)
    return q, kc, vc, build_metadata(tables, list(ctx), list(qlen), bs, DEV)

def reference(q, kc, vc, meta, scale):
    clean = lambda c: torch.nan_to_num(c.float(), nan=0.0)
    return paged_attention_ref(q.float(), clean(kc), clean(vc), meta, scale)

def contiguous_to_paged(kcont, vcont, bs, seed):
    "A paged pool holding (B, L, Hkv, D) contiguous K/V, blocks in shuffled order; block tables (B, L // bs) int32."
    B, L, hkv, d = kcont.shape
    nb = B * L // bs
    perm = torch.randperm(nb, device=DEV, generator=torch.Generator(device=DEV).manual_seed(seed))
    kc = torch.empty(nb, bs, hkv, d, dtype=kcont.dtype, device=DEV); vc = torch.empty_like(kc)
    kc[perm] = kcont.reshape(nb, bs, hkv, d); vc[perm] = vcont.reshape(nb, bs, hkv, d)
    return kc, vc, perm.view(B, L // bs).to(torch.int32)

# ---------------------------------------------------------------- 1. ceilings
def ceilings():
    n = (2**20 if SMOKE else 2**30)  # 2 GiB of bf16
    x = torch.randn(n, device=DEV).to(BF16); y = torch.empty_like(x)
    t = med(lambda: y.copy_(x), graph=False)  # captured in a graph, a copy becomes a copy-engine node (2.8 TB/s, not 4.3)
    copy_TBps = 2 * x.numel() * x.element_size() / (t * 1e-3) / 1e12
    m = 256 if SMOKE else 8192
    a, b = torch.randn(m, m, device=DEV).to(BF16), torch.randn(m, m, device=DEV).to(BF16)
    t_mm = med(lambda: a @ b)
    row = dict(copy_TBps=copy_TBps, matmul_TFLOPs=2 * m**3 / (t_mm * 1e-3) / 1e12)
    if not SMOKE:  # pinned host memory: the swap path's ceiling (PCIe)
        h = torch.empty(2**28, dtype=torch.int8).pin_memory(); dd = torch.empty(2**28, dtype=torch.int8, device=DEV)
        row['d2h_pinned_GBps'] = h.numel() / (med(lambda: h.copy_(dd, non_blocking=True), graph=False) * 1e-3) / 1e9
        row['h2d_pinned_GBps'] = h.numel() / (med(lambda: dd.copy_(h, non_blocking=True), graph=False) * 1e-3) / 1e9
    return row

# ---------------------------------------------------------------- 2. checks
def checks():
    rows = []
    def add(name, err, tol):
        rows.append(dict(check=name, rel_err=err, tol=tol, ok=bool(err <= tol)))
        print(f'  {"ok  " if err <= tol else "FAIL"} {name}: {err:.2e} (tol {tol:g})', flush=True)
    scale = D ** -0.5
    # store_kv: exact, from a strided (fused QKV) view, a padding slot -1
    T = 64 if SMOKE else 4096
    qkv = torch.randn(T, (HQ + 2 * HKV) * D, device=DEV).to(BF16)
    k, v = qkv[:, HQ * D:(HQ + HKV) * D].view(T, HKV, D), qkv[:, (HQ + HKV) * D:].view(T, HKV, D)
    kc = torch.randn(T // BS + 7, BS, HKV, D, device=DEV).to(BF16); vc = torch.randn_like(kc)
    slots = torch.randperm(kc.shape[0] * BS, device=DEV)[:T]
    kc2, vc2 = kc.clone(), vc.clone()
    store_kv(k, v, kc, vc, slots); store_kv_triton(k, v, kc2, vc2, slots)
    add(f'store_kv_triton == store_kv, {T} tokens (max abs diff)', max((kc - kc2).abs().max().item(), (vc - vc2).abs().max().item()), 0.0)
    # decode: GQA ratios, head sizes, block sizes, split counts
    L = 60 if SMOKE else 4000
    for hq, hkv, d, bs in ([(4, 2, 16, 4), (6, 2, 16, 16)] if SMOKE else
                           [(32, 8, 128, 16), (32, 8, 128, 32), (32, 32, 128, 16), (64, 8, 128, 16), (9, 3, 64, 16), (28, 4, 128, 16)]):
        lens = torch.randint(1, L, (5 if SMOKE else 64,), generator=torch.Generator().manual_seed(hq + bs)).tolist()
        q, kc, vc, m = paged_batch([x - 1 for x in lens], [1] * len(lens), bs, hq, hkv, d, BF16, seed=hq * bs)
        ref = reference(q, kc, vc, m, d ** -0.5)
        for splits in (None, 1, 4):
            out = paged_decode_attention(q, kc, vc, m.block_tables, m.seq_lens, d ** -0.5, num_splits=splits, out=torch.full_like(q, NAN))
            add(f'decode {hq}/{hkv} heads, dim {d}, block {bs}, {len(lens)} seqs <= {L}, splits {splits or "auto"}', rel_err(out, ref), 1e-2)
    q, kc, vc, m = paged_batch([L * 2 - 1], [1], BS, HQ, HKV, D, BF16, seed=7)  # batch 1, long: the split path
    ref = reference(q, kc, vc, m, scale)
    for splits in (None, 7, 64):
        out = paged_decode_attention(q, kc, vc, m.block_tables, m.seq_lens, scale, num_splits=splits, out=torch.full_like(q, NAN))
        add(f'decode batch 1 x {L * 2}, splits {splits or "auto"}', rel_err(out, ref), 1e-2)
    # mixed batches: prefills, extends (prefix ending inside a block), decodes
    for bs in (BS, 2 * BS):
        if SMOKE: ctx, qlen = [0, 21, 0, 6, 30, 9], [9, 13, 40, 5, 1, 1]
        else: ctx, qlen = [0, 700, 0, 3001, 5] + torch.randint(1, 4000, (60,)).tolist(), [1000, 300, 77, 1100, 129] + [1] * 60
        q, kc, vc, m = paged_batch(ctx, qlen, bs, HQ, HKV, D, BF16, seed=bs)
        out = paged_attention_triton(q, kc, vc, m, scale, out=torch.full_like(q, NAN))
        add(f'paged_attention_triton, block {bs}: {m.num_prefills} prefills/extends + {m.num_seqs - m.num_prefills} decodes',
            rel_err(out, reference(q, kc, vc, m, scale)), 1e-2)
    # the decode path under a CUDA graph (the engine captures decode steps)
    if not SMOKE:
        q, kc, vc, m = paged_batch(torch.randint(1, 3000, (32,)).tolist(), [1] * 32, BS, HQ, HKV, D, BF16, seed=11)
        out = torch.full_like(q, NAN)
        paged_decode_attention(q, kc, vc, m.block_tables, m.seq_lens, scale, max_seq_len=4096, out=out)  # compile outside
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g): paged_decode_attention(q, kc, vc, m.block_tables, m.seq_lens, scale, max_seq_len=4096, out=out)
        out.fill_(NAN); g.replay(); torch.cuda.synchronize()
        add('decode captured in a CUDA graph, replayed', rel_err(out, reference(q, kc, vc, m, scale)), 1e-2)
    # copy_blocks: exact
    pool = torch.randn(4, 2, 64, BS, HKV, D, device=DEV).to(BF16)
    src, dst = torch.arange(0, 20, device=DEV), torch.arange(30, 50, device=DEV)
    exp = pool.clone(); exp[:, :, dst] = exp[:, :, src]
    copy_blocks_triton(pool, src, dst)
    add('copy_blocks_triton == torch indexed copy (max abs diff)', (pool - exp).abs().max().item(), 0.0)
    return rows

# ---------------------------------------------------------------- 3. decode timings
DECODE_CFGS = [(64, 4, 2), (64, 4, 3), (32, 4, 3), (128, 4, 2)]  # (block_n, warps, stages); the first is the default

def decode_point(B, L, copy_TBps, sweep):
    scale = D ** -0.5
    kcont = torch.randn(B, L, HKV, D, device=DEV).to(BF16); vcont = torch.randn_like(kcont)
    kc, vc, tables = contiguous_to_paged(kcont, vcont, BS, seed=B + L)
    q = torch.randn(B, HQ, D, device=DEV).to(BF16)
    lens = torch.full((B,), L, dtype=torch.int32, device=DEV)
    out = torch.full_like(q, NAN)
    ours = lambda **kw: paged_decode_attention(q, kc, vc, tables, lens, scale, max_seq_len=L, out=out, **kw)
    theirs = lambda: sdpa(q.view(B, HQ, 1, D), kcont.transpose(1, 2), vcont.transpose(1, 2), scale=scale)
    ours()
    err = rel_err(out, theirs().view(B, HQ, D))
    splits = decode_num_splits(B, HKV, L, num_sms(q.device))
    t1, t_sdpa, t2, t_eager = bench(ours), bench(theirs), bench(ours), bench(ours, graph=False)
    kv_bytes = 2 * B * L * HKV * D * kcont.element_size()
    row = dict(batch=B, context=L, splits=splits, triton_us=t1[1] * 1e3, triton_us_again=t2[1] * 1e3,
               triton_us_p20=t1[0] * 1e3, triton_us_p80=t1[2] * 1e3, sdpa_us=t_sdpa[1] * 1e3,
               sdpa_over_triton=t_sdpa[1] / t1[1], triton_eager_us=t_eager[1] * 1e3, kv_MB=kv_bytes / 1e6,
               triton_TBps=kv_bytes / (t1[1] * 1e-3) / 1e12, sdpa_TBps=kv_bytes / (t_sdpa[1] * 1e-3) / 1e12,
               copy_TBps=copy_TBps, triton_frac_of_copy=kv_bytes / (t1[1] * 1e-3) / 1e12 / copy_TBps, err_vs_sdpa=err)
    best = (row['triton_us'], f'default {DECODE_CFGS[0]} splits {splits}')
    grid = [(sp, c) for sp in (1, 2, 4, 8, 16, 32, 64) if (sp - 1) * 64 < L for c in DECODE_CFGS] if B <= 32 else \
           [(1, c) for c in DECODE_CFGS[1:]]  # small batches: split counts x tiles; large ones fill the GPU unsplit
    for sp, (bn, w, st) in grid:
        if sp == splits and (bn, w, st) == DECODE_CFGS[0]: continue
        t = med(lambda: ours(num_splits=sp, block_n=bn, num_warps=w, num_stages=st)) * 1e3
        sweep.append(dict(kernel='decode', batch=B, context=L, variant=f'splits {sp} block_n {bn} warps {w} stages {st}', us=t))
        if t < best[0]: best = (t, f'{(bn, w, st)} splits {sp}')
    if B <= 8:  # the same two timed with a write as the flush, to show what it costs small kernels
        row['triton_us_write_flush'] = bench(ours, write_flush=True)[1] * 1e3
        row['sdpa_us_write_flush'] = bench(theirs, write_flush=True)[1] * 1e3
    row['best_us'], row['best_variant'] = best
    print(f'  decode B={B:3d} L={L:5d} splits {splits:2d}: triton {row["triton_us"]:8.1f} us ({row["triton_TBps"]:.2f} TB/s)'
          f'  sdpa {row["sdpa_us"]:8.1f} us  ratio {row["sdpa_over_triton"]:.2f}  best {best[0]:.1f} {best[1]}  err {err:.1e}', flush=True)
    return row

# ---------------------------------------------------------------- 4. prefill timings
PREFILL_CFGS = [None, (128, 128, 8, 3), (64, 64, 4, 3), (128, 32, 4, 4), (128, 64, 8, 3)]  # None: the wrapper's choice

def prefill_point(B, L, ctx, sweep):
    "B sequences of L tokens, the first `ctx` of them cached (an extend when ctx > 0)."
    scale = D ** -0.5
    kcont = torch.randn(B, L, HKV, D, device=DEV).to(BF16); vcont = torch.randn_like(kcont)
    kc, vc, tables = contiguous_to_paged(kcont, vcont, BS, seed=B * L)
    n = L - ctx
    q = torch.randn(B * n, HQ, D, device=DEV).to(BF16)
    meta = build_metadata(tables.tolist(), [ctx] * B, [n] * B, BS, DEV)
    out = torch.full_like(q, NAN)
    ours = lambda **kw: paged_prefill_attention(q, kc, vc, meta, scale, out=out, **kw)
    qs = q.view(B, n, HQ, D).transpose(1, 2)
    if ctx == 0: theirs = lambda: sdpa(qs, kcont.transpose(1, 2), vcont.transpose(1, 2), scale=scale, is_causal=True)
    else:
        from torch.nn.attention.bias import causal_lower_right
        bias = causal_lower_right(n, L)
        theirs = lambda: sdpa(qs, kcont.transpose(1, 2), vcont.transpose(1, 2), scale=scale, attn_mask=bias)
    ours()
    try: ref = theirs(); err = rel_err(out, ref.transpose(1, 2).reshape(B * n, HQ, D)); t_sdpa = med(theirs) * 1e3
    except RuntimeError as e: print('  sdpa:', str(e).split('\n')[0]); err, t_sdpa = NAN, NAN
    t1, t2 = med(ours) * 1e3, med(ours) * 1e3
    flops = 4 * B * HQ * D * (n * ctx + n * n / 2)  # QK^T and PV over the visible keys (causal: half the square)
    row = dict(batch=B, context=L, cached=ctx, triton_us=t1, triton_us_again=t2, sdpa_us=t_sdpa, triton_over_sdpa=t1 / t_sdpa,
               triton_TFLOPs=flops / (t1 * 1e-6) / 1e12, sdpa_TFLOPs=flops / (t_sdpa * 1e-6) / 1e12, err_vs_sdpa=err)
    best = (t1, 'default (wrapper rule)')
    for bm, bn, w, st in PREFILL_CFGS[1:]:
        try: t = med(lambda: ours(block_m=bm, block_n=bn, num_warps=w, num_stages=st)) * 1e3
        except Exception as e: print(f'  prefill cfg {(bm, bn, w, st)} failed: {type(e).__name__}'); t = NAN
        sweep.append(dict(kernel='prefill', batch=B, context=L, variant=f'block_m {bm} block_n {bn} warps {w} stages {st} cached {ctx}', us=t))
        if t < best[0]: best = (t, str((bm, bn, w, st)))
    row['best_us'], row['best_variant'] = best
    print(f'  prefill B={B} L={L} cached {ctx}: triton {t1:8.1f} us ({row["triton_TFLOPs"]:.0f} TFLOP/s)  sdpa {t_sdpa:8.1f} us'
          f'  triton/sdpa {row["triton_over_sdpa"]:.2f}  best {best[0]:.1f} {best[1]}  err {err:.1e}', flush=True)
    return row

# ---------------------------------------------------------------- 5. block copies
def copy_point(num_pairs, copy_TBps):
    layers, nb = (2, 64) if SMOKE else (32, 4096)
    pool = torch.randn(layers, 2, nb, BS, HKV, D, device=DEV).to(BF16)  # 8.6 GB on the GPU: Llama-3-8B shape
    idx = torch.randperm(nb, device=DEV)
    src, dst = idx[:num_pairs], idx[nb // 2:nb // 2 + num_pairs]
    flat = pool.view(layers * 2, nb, -1)
    def torch_index(): pool[:, :, dst] = pool[:, :, src]
    def torch_index_copy(): flat.index_copy_(1, dst, flat.index_select(1, src))
    exp = pool.clone(); torch_index_copy(); ok = torch.equal(pool[:, :, dst], exp[:, :, src])
    copy_blocks_triton(pool, src, dst); ok &= torch.equal(pool[:, :, dst], exp[:, :, src])
    moved = 2 * num_pairs * layers * 2 * BS * HKV * D * pool.element_size()  # bytes read + written
    row = dict(pairs=num_pairs, layers=layers, MB_moved=moved / 1e6, equal=ok, copy_TBps=copy_TBps)
    for name, fn in [('triton', lambda: copy_blocks_triton(pool, src, dst)), ('torch_index', torch_index), ('torch_index_copy', torch_index_copy)]:
        t = med(fn) * 1e3
        row[f'{name}_us'], row[f'{name}_TBps'] = t, moved / (t * 1e-6) / 1e12
    print(f'  copy {num_pairs} blocks x {layers} layers: triton {row["triton_us"]:.1f} us, torch [] = [] {row["torch_index_us"]:.1f} us,'
          f' index_copy_ {row["torch_index_copy_us"]:.1f} us, equal {ok}', flush=True)
    del pool, exp
    return row

# ---------------------------------------------------------------- summary of a run, without a GPU
def summarize(folder, copy_TBps=None):
    """DIR/decode_summary.csv: each decode point at the split count that `decode_num_splits` picks *now*, timed in the
    run that wrote DIR (its default row, or its sweep row with the default tiles), against SDPA from the same run.

    For when the heuristic changed after a run: every count it can pick was timed in the sweep (batches up to 32).
    """
    dec = list(csv.DictReader(open(f'{folder}/decode.csv')))
    sweep = {(int(r['batch']), int(r['context']), r['variant']): float(r['us'])
             for r in csv.DictReader(open(f'{folder}/decode_sweep.csv')) if r['kernel'] == 'decode'}
    copy_TBps = copy_TBps or float(next(csv.DictReader(open(f'{folder}/ceilings.csv')))['copy_TBps'])
    bn, w, st = DECODE_CFGS[0]
    rows = []
    for r in dec:
        B, L = int(r['batch']), int(r['context'])
        sp = decode_num_splits(B, HKV, L, 132)
        t = float(r['triton_us']) if int(r['splits']) == sp else sweep.get((B, L, f'splits {sp} block_n {bn} warps {w} stages {st}'), NAN)
        kv = float(r['kv_MB']) * 1e6
        rows.append(dict(batch=B, context=L, splits=sp, triton_us=t, source='default row' if int(r['splits']) == sp else 'sweep row',
                         sdpa_us=float(r['sdpa_us']), sdpa_over_triton=float(r['sdpa_us']) / t, triton_TBps=kv / (t * 1e-6) / 1e12,
                         sdpa_TBps=float(r['sdpa_TBps']), copy_TBps=copy_TBps, triton_frac_of_copy=kv / (t * 1e-6) / 1e12 / copy_TBps,
                         triton_eager_us=float(r['triton_eager_us']) if r.get('triton_eager_us') else NAN))
    write(f'{folder}/decode_summary.csv', rows)
    print('decode (us):  B     L  splits  triton   sdpa  sdpa/triton  TB/s  of-copy')
    for r in rows:
        print(f'          {r["batch"]:4d} {r["context"]:5d}  {r["splits"]:5d} {r["triton_us"]:8.1f} {r["sdpa_us"]:7.1f}  {r["sdpa_over_triton"]:8.2f}'
              f'  {r["triton_TBps"]:6.2f}  {r["triton_frac_of_copy"]:5.0%}')

# ---------------------------------------------------------------- main
def write(path, rows):
    if not rows: return
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, 'w', newline='') as f:
        w = csv.DictWriter(f, keys); w.writeheader()
        for r in rows: w.writerow({k: (f'{v:.4g}' if isinstance(v, float) else v) for k, v in r.items()})

def main():
    ap = argparse.ArgumentParser(description='Check and time the Triton kernels beside torch SDPA.')
    ap.add_argument('--out', default=None, help='results folder (default: kernels/results/triton_kernels/<machine>)')
    ap.add_argument('--smoke', action='store_true', help='tiny shapes through Triton\'s interpreter, no GPU')
    ap.add_argument('--skip-sweep', action='store_true', help='time only the default variants')
    ap.add_argument('--summarize', metavar='DIR', help='no GPU: write DIR/decode_summary.csv from a run\'s raw files')
    ap.add_argument('--copy-TBps', type=float, help='with --summarize: the copy ceiling to use instead of DIR/ceilings.csv')
    args = ap.parse_args()
    if args.summarize: return summarize(args.summarize, args.copy_TBps)
    if args.out is None:
        from lab import default_out
        args.out = str(default_out('triton_kernels_smoke' if SMOKE else 'triton_kernels'))
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    env = dict(torch=torch.__version__, triton=triton.__version__, device=torch.cuda.get_device_name() if not SMOKE else 'cpu (interpreter)',
               sms=num_sms(torch.device(DEV)))
    print(env, flush=True)
    t0 = time.time()
    ceil = ceilings() | env; print(' ', ceil, flush=True)
    write(f'{args.out}/ceilings.csv', [ceil])
    rows = checks(); write(f'{args.out}/checks.csv', rows)
    print(f'checks: {sum(r["ok"] for r in rows)}/{len(rows)} passed ({time.time() - t0:.0f} s)', flush=True)
    sweep, dec, pre, cp = [], [], [], []
    points = [(1, 64), (4, 128)] if SMOKE else [(b, l) for b in (1, 8, 64, 256) for l in (1024, 4096, 8192)] + [(16, 1024), (16, 4096), (32, 1024), (32, 4096)]
    for B, L in points:
        dec.append(decode_point(B, L, ceil['copy_TBps'], sweep if not args.skip_sweep else []))
        write(f'{args.out}/decode.csv', dec); write(f'{args.out}/decode_sweep.csv', sweep)
        torch.cuda.empty_cache() if not SMOKE else None
    for B, L, ctx in ([(1, 40, 0), (2, 48, 16)] if SMOKE else [(1, 4096, 0), (8, 1024, 0), (1, 16384, 0), (4, 4096, 3072), (16, 512, 0)]):
        pre.append(prefill_point(B, L, ctx, sweep if not args.skip_sweep else []))
        write(f'{args.out}/prefill.csv', pre); write(f'{args.out}/decode_sweep.csv', sweep)
    for n in (4, 512 if not SMOKE else 16):
        cp.append(copy_point(n, ceil['copy_TBps'])); write(f'{args.out}/copy.csv', cp)
    print(f'\ntotal {time.time() - t0:.0f} s; copy ceiling {ceil["copy_TBps"]:.2f} TB/s, matmul {ceil["matmul_TFLOPs"]:.0f} TFLOP/s')
    print('decode (us):  B     L  splits  triton   sdpa  sdpa/triton  TB/s  of-copy')
    for r in dec:
        print(f'          {r["batch"]:4d} {r["context"]:5d}  {r["splits"]:5d} {r["triton_us"]:8.1f} {r["sdpa_us"]:7.1f}  {r["sdpa_over_triton"]:8.2f}'
              f'  {r["triton_TBps"]:6.2f}  {r["triton_frac_of_copy"]:5.0%}')
    print('prefill (us): B     L  cached  triton   sdpa  triton/sdpa  TFLOP/s')
    for r in pre:
        print(f'          {r["batch"]:4d} {r["context"]:5d} {r["cached"]:6d} {r["triton_us"]:8.1f} {r["sdpa_us"]:7.1f}  {r["triton_over_sdpa"]:8.2f}  {r["triton_TFLOPs"]:6.0f}')
    print(f'checks: {sum(r["ok"] for r in rows)}/{len(rows)} passed')

if __name__ == '__main__':
    main()
