#!/bin/bash
# Speculative decoding on a GPU, the paged-infer side, in one call: n-gram drafts on the default model at batch 1 on
# copy-heavy prompts for each k, and at batch 64 on open questions with every step and the pause rule watched; it also
# writes the prompts' token ids for real vLLM's run (benchmarks/peer/spec_vllm.py). The default model must be
# importable (its GGUF wheel); it is converted once (~15 s).
#   bash kernels/spec_gpu_suite.sh OUTDIR [KS] [--profile]     # KS: the k values at batch 1, default 4,6,8,10
# The two workloads run in processes of their own. Writes OUTDIR/spec_decode_b1.json, spec_decode_b64.json and
# prompts.json (both workloads' token ids); with --profile also the step profile with and without drafts
# (profile_b1_copy.json, trace_k0_b1.json.gz, trace_k6_b1.json.gz) and the draft model runs (draft_model_gpu.json).
# The console output is the record: redirect it, e.g. to OUTDIR/suite.log.
set -u
OUT=$1
mkdir -p "$OUT"
KS=${2:-4,6,8,10}
export PYTHONUNBUFFERED=1
DIR=$(python -c 'from paged_infer.model.default_model import prepare_default_model as p; print(p())' 2>/dev/null | tail -1)
echo "model folder: $DIR"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv
python -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
python benchmarks/spec_decode.py --ks "$KS" --batch 0 --out "$OUT/spec_decode_b1.json" \
    --dump-prompts "$OUT/prompts_b1.json"
python benchmarks/spec_decode.py --ks "$KS" --no-batch1 --batch 64 --rounds 15 --watch \
    --out "$OUT/spec_decode_b64.json" --dump-prompts "$OUT/prompts_b64.json"
python - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
prompts = json.load(open(f'{out}/prompts_b1.json')) | {'batched': json.load(open(f'{out}/prompts_b64.json'))['batched']}
json.dump(prompts, open(f'{out}/prompts.json', 'w'))  # both workloads' token ids, for spec_vllm.py
PY
if [ "${3:-}" = --profile ]; then
    python kernels/spec_step_profile.py --ks 0,6 --batch 1 --out "$OUT/profile_b1_copy.json"
    python kernels/spec_step_profile.py --ks 0,6 --batch 1 --trace "$OUT" > /dev/null
    python kernels/draft_model_gpu.py --model "$DIR" --dtype float32 --out "$OUT/draft_model_gpu.json"
fi
