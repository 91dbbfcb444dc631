#!/bin/bash
# The pause rule on a GPU at batch 64 (open questions, sampled), every step watched (benchmarks/spec_decode.py
# --watch), with random weights, where drafts are rarely right: the default model's config (k = 4, 15 rounds) and the
# Llama-3.1-8B shape (k = 4, 7 rounds). The default model itself: spec_gpu_suite.sh. TOK: a folder of the default
# model's config.json and tokenizer.
#   bash kernels/spec_gpu_pause.sh OUTDIR TOK
# Each run's console output goes to OUTDIR/<name>.log, its results to OUTDIR/<name>.json.
set -u
OUT=$1
TOK=$2
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
run() {
    local name=$1
    shift
    timeout 165 python benchmarks/spec_decode.py --no-batch1 --batch 64 --watch --out "$OUT/$name.json" "$@" \
        > "$OUT/$name.log" 2>&1
    echo "$name: exit $?"
    grep -E '^batch' "$OUT/$name.log"
}
run b64_dummy --ks 4 --rounds 15 --model "$TOK" --load-format dummy
run b64_8b --ks 4 --rounds 7 --shape llama-3.1-8b --tokenizer "$TOK"
