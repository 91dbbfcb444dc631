#!/bin/bash
# The candidate quantized kernels on a GPU in one call, each step under its own time limit, outputs packed into one
# archive (a device call returns 8 files at most):
#   1. kernels/fp8_rows_ab.py: the float8 kernel for few rows (w @ x.T) against its plain form (x @ w.T) and
#      torch._scaled_mm (checks, then 1-32 rows), and the row count up to which it beats torch._scaled_mm;
#   2. kernels/gemv_row_ab.py --grid: the int4 row kernel with its K loop pipelined (Triton), and its launches;
#   3. the engine's GPTQ batch-1 step, with and without the output layer quantized, as committed and with the
#      pipelined row kernel at the grid's launches;
#   4. the engine: bf16 and fp8 as committed, then fp8 with the plain kernel up to 8 rows, as committed until
#      2026-12-08 (batch 1 and 256, 256 sharegpt-like requests).
# The kernel A/Bs come first: with little time left, the engine runs are the ones skipped.
# TOK: a folder of the default model's config.json and tokenizer. ARCHIVE: where the packed outputs go.
#   bash kernels/quant_ab_suite.sh OUTDIR TOK ARCHIVE [SECONDS]
# On a device machine, e.g.: bash kernels/quant_ab_suite.sh $OUT/q /tmp/tok $OUT/res.tgz 520 && rm -rf $OUT/q
set -u
OUT=$1
TOK=$2
ARCHIVE=$3
BUDGET=${4:-540}  # seconds for all the steps; each step gets what is left, up to its own limit
START=$SECONDS
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
left() {
    local t=$((BUDGET - (SECONDS - START)))
    [ "$t" -gt "$1" ] && t=$1
    echo "$t"
}
step() {  # step NAME LIMIT COMMAND...: skipped when fewer than 20 seconds are left
    local name=$1 t
    t=$(left "$2")
    shift 2
    if [ "$t" -lt 20 ]; then
        echo "$name: skipped, ${t} s left"
        return
    fi
    timeout "$t" "$@" > "$OUT/$name.log" 2>&1
    echo "$name: exit $? after $((SECONDS - START)) s"
}
engine() {  # engine NAME LIMIT ARGS...
    local name=$1 limit=$2
    shift 2
    step "$name" "$limit" python kernels/quant_engine_bench.py --tokenizer "$TOK" --engines ours --out "$OUT" \
        --name "$name.json" "$@"
    grep -E '^ours' "$OUT/$name.log" 2>/dev/null
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/card.txt"
step fp8_rows_ab 120 python kernels/fp8_rows_ab.py --no-grid --out "$OUT"
grep -E -A3 'failures' "$OUT/fp8_rows_ab.log" 2>/dev/null | head -5
grep -E -A4 'fastest of each|FP8_DOT_ROWS' "$OUT/fp8_rows_ab.log" 2>/dev/null
step gemv_row_ab 110 python kernels/gemv_row_ab.py --grid --out "$OUT"
grep -E -A1 'failures' "$OUT/gemv_row_ab.log" 2>/dev/null | head -3
grep -E -A4 'fastest launches' "$OUT/gemv_row_ab.log" 2>/dev/null
engine e_int 60 --methods gptq,gptq-lm-head --batch-sizes 1 --requests 0
LAUNCH=()
[ -f "$OUT/gemv_launch.json" ] && LAUNCH=(--gemv-launch "$OUT/gemv_launch.json")
engine e_int_staged 60 --methods gptq,gptq-lm-head --batch-sizes 1 --requests 0 --gemv-kernel staged "${LAUNCH[@]}"
engine e_fp8 100 --methods bf16,fp8 --batch-sizes 1,256 --requests 256
engine e_fp8_plain 60 --methods fp8 --batch-sizes 1,256 --requests 256 --fp8-kernel plain --fp8-dot-rows 8
tar czf "$ARCHIVE" -C "$(dirname "$OUT")" "$(basename "$OUT")"
echo "packed $(du -h "$ARCHIVE" | cut -f1) into $ARCHIVE after $((SECONDS - START)) s"
