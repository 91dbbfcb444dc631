"""What a loop of a Triton kernel costs in instructions, without a GPU: compile it for sm_90 (Triton's bundled ptxas),
disassemble, and count the SASS instructions of its innermost loop (from a label to the branch back to it), by
opcode, per weight of the packed tile an iteration reads.

    python kernels/sass_census.py      # the int4 row kernel (`_int_gemv_kernel`) and the tile kernel at 16 rows

Integer arguments and pointers get the divisibility by 16 that Triton's JIT gives the real shapes (N, K and the
strides of the 8B shape are multiples of 16), so loads vectorize as they do on the GPU.
"""
import collections
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from paged_infer.ops.quant_gemm import _int_gemm_kernel, _int_gemv_kernel  # noqa: E402

NVDISASM = Path(triton.__file__).parent / 'backends' / 'nvidia' / 'bin' / 'nvdisasm'
COMMON = {'x_ptr': '*bf16', 'qw_ptr': '*i32', 's_ptr': '*bf16', 'z_ptr': '*bf16', 'out_ptr': '*bf16',
          'part_ptr': '*fp32', 'lock_ptr': '*i32'}


def compile_sass(fn, ints: list, const: dict, num_warps: int = 4, num_stages: int = 3) -> str:
    sig = dict(COMMON, **{name: 'i32' for name in ints}, **{k: 'constexpr' for k in const})
    attrs = {(i,): [['tt.divisibility', 16]] for i in range(len(COMMON) + len(ints))}
    k = triton.compile(ASTSource(fn, sig, const, attrs), target=GPUTarget('cuda', 90, 32),
                       options=dict(num_warps=num_warps, num_stages=num_stages))
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / 'kernel.cubin'
        path.write_bytes(k.asm['cubin'])
        return subprocess.run([str(NVDISASM), '-c', str(path)], capture_output=True, text=True, check=True).stdout


def inner_loop(sass: str) -> list:
    "The opcodes between a label and the backward branch to it: the longest such loop (the K loop)."
    lines = sass.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := re.match(r'^(\.L_x_\d+):', line))}
    loops = []
    for i, line in enumerate(lines):
        m = re.search(r'BRA `\((\.L_x_\d+)\)', line)
        if m and labels.get(m.group(1), i) < i:
            loops.append((labels[m.group(1)], i))
    start, end = max(loops, key=lambda se: se[1] - se[0])
    ops = []
    for line in lines[start:end + 1]:
        m = re.match(r'^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)(\.[A-Z0-9_.]+)?', line)
        if m:
            ops.append(m.group(1) + (m.group(2) or ''))
    return ops


def report(name: str, sass: str, weights: int):
    ops = inner_loop(sass)
    by = collections.Counter(op.split('.')[0] for op in ops)
    print(f'{name}: {len(ops)} instructions a loop iteration of a thread, {weights} weights: '
          f'{len(ops) / weights:.2f} a weight')
    print('   ', '  '.join(f'{op} {n}' for op, n in by.most_common()))


def main():
    print('triton', triton.__version__, 'target sm_90')
    gemv_ints = ['N', 'K', 'stride_xm', 'stride_qk', 'stride_sg', 'stride_om', 'magic']
    for unpack in ('bits', 'cast'):
        const = dict(GROUP=128, BITS=4, BLOCK_N=64, BLOCK_K=128, SPLIT_K=4, UNPACK=unpack)
        sass = compile_sass(_int_gemv_kernel, gemv_ints, const)
        report(f'row kernel, UNPACK={unpack!r}, 64 x 128 a program, 4 warps', sass, 64 * 128 // 128)
    tile_ints = ['M', 'N', 'K', 'stride_xm', 'stride_qk', 'stride_sg', 'stride_om']
    for extra in (dict(UNPACK='bits'), dict(UNPACK='after', SWAP=True, OFF=128),
                  dict(UNPACK='planes', SWAP=True, OFF=128, ASM=True), dict(UNPACK='planes', OFF=128, ASM=True)):
        const = dict(GROUP=128, BITS=4, BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, SPLIT_K=4, SWAP=False, OFF=0, ASM=False)
        const.update(extra)
        report(f'tile kernel 16 x 64, {extra}', compile_sass(_int_gemm_kernel, tile_ints, const, num_stages=4),
               64 * 128 // 128)


if __name__ == '__main__':
    main()
