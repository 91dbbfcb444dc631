#!/bin/bash
# Tensor parallelism on two GPUs, in one call (about 20 minutes on two H200s with real vLLM installed; the 70B part
# needs two GPUs of more than 80 GB each):
#   bash kernels/tp_gpu_suite.sh OUTDIR [TOKENIZER_DIR]
# 1. tests/gpu/gpu_tp_check.py --parts tiny: TP=2 against TP=1 and HF, eager, with CUDA graphs on both ranks, with
#    async and multi-step scheduling (token identity, float32).
# 2. The 8B shape, sharegpt-like, 256 requests: one rank against two (graphs, async scheduling), random weights.
# 3. The Llama-3.1-70B shape on two ranks (random weights made on the GPUs, load_format dummy): offline throughput
#    and the batch-1 step, each beside real vLLM with tensor_parallel_size=2 on the same requests when
#    $VLLM_PYTHONPATH names the folder its packages are installed in.
# Every command's output goes to OUTDIR (one JSON file and one log each).
set -u
OUT=$1
TOK=${2:-$(python -c 'from paged_infer.model.default_model import prepare_default_model as p; print(p())' | tail -1)}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv
python -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
python tests/gpu/gpu_tp_check.py --parts tiny --assets "$TOK" --out "$OUT" 2>&1 | tee "$OUT/gpu_tp_check.log"
bench() {  # NAME ARGS...: one paged-infer bench run, its JSON and its log
    local name=$1
    shift
    python benchmarks/bench.py "$@" --tokenizer "$TOK" --no-progress --out "$OUT/$name.json" 2>&1 \
        | tee "$OUT/$name.log" | tail -5
}
W8=(throughput --shape llama-3.1-8b --workload sharegpt-like --num-requests 256)
bench 8b_sharegpt_n256_tp1 "${W8[@]}"
bench 8b_sharegpt_n256_tp2 "${W8[@]}" --tensor-parallel-size 2 --async-scheduling
bench 8b_sharegpt_n256_tp2_eager "${W8[@]}" --tensor-parallel-size 2 --enforce-eager
PEER=()
if [ -n "${VLLM_PYTHONPATH:-}" ]; then
    PEER=(--backend vllm --vllm-pythonpath "$VLLM_PYTHONPATH")
fi
W70=(--shape llama-3.1-70b --load-format dummy --tensor-parallel-size 2 --async-scheduling)
bench 70b_sharegpt_n256_tp2 throughput "${W70[@]}" --workload sharegpt-like --num-requests 256 "${PEER[@]}"
bench 70b_latency_b1_tp2 latency "${W70[@]}" --batch-size 1 --input-len 128 --output-len 256 "${PEER[@]}"
