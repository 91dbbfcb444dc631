#!/usr/bin/env bash
# Build a vLLM 0.24.0 bundle for an H200 machine without network (Python 3.12, torch 2.11.0+cu130) that can run
# mixtures of experts: the bundle of the peer-benchmark tools with vLLM's MoE extension (_moe_C) kept.
# Output: DEST/bundle.tar.xz.part-aa, -ab, ... (36 MiB each: one part and a working tree fit a 64 MiB device call)
# and DEST/SHA256SUMS.
# Usage: build_vllm.sh DEST PACKAGES.txt   (PACKAGES.txt: the pinned wheels vLLM's offline path imports)
set -euo pipefail
DEST=$(mkdir -p "${1:?usage: build_vllm.sh DEST PACKAGES.txt}" && cd "$1" && pwd)
PACKAGES=$(cd "$(dirname "${2:?usage: build_vllm.sh DEST PACKAGES.txt}")" && pwd)/$(basename "$2")
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
      --platform manylinux1_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_34_x86_64)
python3 -m pip download -q --no-deps "${plat[@]}" -d "$W/whl" vllm==0.24.0 $(grep -v '^#' "$PACKAGES")
S="$W/site"; mkdir -p "$S"
for w in "$W"/whl/*.whl; do unzip -q -o "$w" -d "$S"; done
for d in "$S"/*.data; do [ -e "$d" ] || continue
  for sub in purelib platlib; do [ -d "$d/$sub" ] && cp -a "$d/$sub/." "$S/"; done; rm -rf "$d"; done
cd "$S/vllm"
# Not on the path of a bf16 Llama, Qwen2, Qwen3-MoE or Mixtral on Hopper (each import is guarded or lazy in 0.24.0);
# _moe_C_stable_libtorch.abi3.so (top-k softmax, moe_align_block_size) stays: the fused-MoE layer needs it.
rm -f vllm_flash_attn/_vllm_fa2_C.abi3.so _qutlass_C.abi3.so \
      _flashmla_C.abi3.so _flashmla_extension_C.abi3.so _rust_tool_parser.abi3.so vllm-rs \
      distributed/kv_transfer/disagg_prefill_workflow.jpg
rm -rf vllm_flash_attn/cute third_party/deep_gemm third_party/fmha_sm100 entrypoints/serve/instrumentator/static
cd "$S"
rm -rf xgrammar/lib xgrammar/include tvm_ffi/3rdparty tvm_ffi/src bin
strip --strip-debug xgrammar/libxgrammar_bindings.so 2>/dev/null || true
find "$S" -name __pycache__ -type d -prune -exec rm -rf {} +
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=2026-01-01 -cf - -C "$S" . | xz -9 -T2 > "$W/bundle.tar.xz"
rm -f "$DEST"/bundle.tar.xz.part-*; split -b 36M -a 2 "$W/bundle.tar.xz" "$DEST/bundle.tar.xz.part-"
(cd "$DEST" && sha256sum bundle.tar.xz.part-* > SHA256SUMS)
ls -l "$DEST"
