#!/bin/bash
# Int4 on a GPU in one call: the tile sweep (kernels/quant_tile_sweep.py: checks, then each config timed at 16 to 256
# rows, the fastest written to int_tiles.json), then the engine on the Llama-3.1-8B shape with random weights
# (kernels/quant_engine_bench.py): bf16, GPTQ as committed, and GPTQ with the sweep's tiles (engine_tiles.json).
# TOK: a folder of the default model's config.json and tokenizer.
#   bash kernels/quant_gpu_suite.sh OUTDIR TOK
set -u
OUT=$1
TOK=$2
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
timeout 280 python kernels/quant_tile_sweep.py --out "$OUT" > "$OUT/quant_tile_sweep.log" 2>&1
echo "sweep: exit $?"
grep -E '^M=|^checked|^failures|fastest' "$OUT/quant_tile_sweep.log"  # whole rows: at times the only copy
bench() {
    local name=$1
    shift
    timeout 140 python kernels/quant_engine_bench.py --tokenizer "$TOK" --engines ours --requests 256 --out "$OUT" \
        --name "$name.json" "$@" > "$OUT/$name.log" 2>&1
    echo "$name: exit $?"
    grep -E '^ours|^settings' "$OUT/$name.log" | cut -c1-300
}
bench engine_gptq --methods bf16,gptq
[ -f "$OUT/int_tiles.json" ] && bench engine_tiles --methods gptq --int-tiles "$OUT/int_tiles.json"
