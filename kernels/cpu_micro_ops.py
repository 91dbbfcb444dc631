"""Two small measurements on a CPU that the engine's choices rest on (median microseconds of repeated calls):

    python kernels/cpu_micro_ops.py

1. The index of each row's largest value of a (57, 49152) float32 batch (a decode step's logits of the default model):
   `argmax(-1)` against `max(-1).indices` (chapter 9's `argmax_rows`), and the other full-row passes of the sampler
   (`log_softmax`, `logsumexp`, `topk(1)`); the two index ways are checked equal on rows full of ties.
2. Decode attention of 8 sequences over 256 gathered keys and values (3 KV heads of 64, 3 query heads each), float32
   and bfloat16: SDPA on the strided view chapter 6 makes of the gathered blocks, on a contiguous copy, with a bool
   and with an additive mask, a matmul-softmax-matmul by hand, and the gather (`index_select`) itself.
"""
import platform
import time

import torch
import torch.nn.functional as F


def us(f, reps=200) -> float:
    for _ in range(10):
        f()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return sorted(times)[reps // 2] * 1e6


def main():
    torch.manual_seed(0)
    print('torch', torch.__version__, 'threads', torch.get_num_threads(), platform.machine(),
          'bf16 instructions', torch.ops.mkldnn._is_mkldnn_bf16_supported())
    x = torch.randn(57, 49152)
    ties = torch.randint(0, 3, (64, 1000)).float()
    assert torch.equal(ties.max(-1).indices, ties.argmax(-1))
    row = dict(argmax=us(lambda: x.argmax(-1)), max_indices=us(lambda: x.max(-1).indices),
               log_softmax=us(lambda: x.log_softmax(-1)), logsumexp=us(lambda: x.logsumexp(-1)),
               topk1=us(lambda: x.topk(1, dim=-1)))
    print('(57, 49152) float32, us:', {k: round(v, 1) for k, v in row.items()})
    n, hkv, g, ctx, d = 8, 3, 3, 256, 64
    for dt in (torch.float32, torch.bfloat16):
        kb = torch.randn(n * ctx // 16, 16, hkv, d, dtype=dt)
        vb = torch.randn(n * ctx // 16, 16, hkv, d, dtype=dt)
        k, v = kb.view(n, -1, hkv, d).transpose(1, 2), vb.view(n, -1, hkv, d).transpose(1, 2)
        q = torch.randn(n, hkv, g, d, dtype=dt)
        mask = (torch.arange(ctx)[None, :] < torch.randint(180, ctx + 1, (n,))[:, None])[:, None, None, :]
        add = torch.zeros(n, 1, 1, ctx, dtype=dt).masked_fill(~mask, float('-inf'))
        kc, vc = k.contiguous(), v.contiguous()
        idx = torch.randperm(kb.shape[0])
        out = torch.empty_like(kb)

        def by_hand():
            s = (q @ k.transpose(-1, -2)).float().masked_fill(~mask, float('-inf')) * d**-0.5
            return torch.softmax(s, -1).to(dt) @ v

        row = dict(sdpa_strided_bool=us(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)),
                   sdpa_contiguous_bool=us(lambda: F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask)),
                   sdpa_strided_additive=us(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=add)),
                   by_hand=us(by_hand), gather_k=us(lambda: torch.index_select(kb, 0, idx, out=out)))
        print(f'decode attention, {dt}, us:', {k: round(v, 1) for k, v in row.items()})


if __name__ == '__main__':
    main()
