#!/bin/bash
# Speculative decoding on a GPU, the paged-infer side, in one call: the n-gram benchmark (batch 1 copies and a batched
# open-ended workload), the step profile with and without drafts (and a torch profiler trace of each), and the draft
# model runs. The default model must be importable (its GGUF wheel); it is converted once (~15 s).
#   bash kernels/spec_gpu_suite.sh OUTDIR [KS]      # KS: the k values at batch 1, default 4,6,8,10
# Writes OUTDIR/spec_decode.json, prompts.json (for benchmarks/peer/spec_vllm.py), profile_b1_copy.json,
# trace_k0_b1.json.gz, trace_k6_b1.json.gz and draft_model_gpu.json (the console output: redirect it, e.g. to
# OUTDIR/suite.log).
set -u
OUT=$1
mkdir -p "$OUT"
KS=${2:-4,6,8,10}
export PYTHONUNBUFFERED=1
DIR=$(python -c 'from paged_infer.model.default_model import prepare_default_model as p; print(p())' 2>/dev/null | tail -1)
echo "model folder: $DIR"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv
python -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
python benchmarks/spec_decode.py --ks "$KS" --batch 64 --out "$OUT/spec_decode.json" --dump-prompts "$OUT/prompts.json"
python kernels/spec_step_profile.py --ks 0,6 --batch 1 --out "$OUT/profile_b1_copy.json"
python kernels/spec_step_profile.py --ks 0,6 --batch 1 --trace "$OUT" > /dev/null
python kernels/draft_model_gpu.py --model "$DIR" --dtype float32 --out "$OUT/draft_model_gpu.json"
