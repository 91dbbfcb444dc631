#!/bin/bash
# TTFT / ITL against request rate, with and without chunked prefill, long prompts among short ones.
# The default model (SmolLM2-135M-Instruct) on this machine's CPU; one server per prefill mode on port 8011; a warm-up
# pass first (not kept); the rates from highest to lowest (so that the lowest rate is not the first traffic a server sees).
#   bash benchmarks/cpu_serving_sweep.sh [OUTPUT_DIR]     # from anywhere, after `make install`
# OUTPUT_DIR defaults to benchmarks/results/serving/cpu (relative to the repository root).
set -e
cd "$(dirname "$0")/.."
OUTPUT_DIR=${1:-benchmarks/results/serving/cpu}
BIN=.venv/bin/paged-infer
mkdir -p "$OUTPUT_DIR"
for mode in chunked whole; do
  if [ $mode = chunked ]; then F="--enable-chunked-prefill --max-num-batched-tokens 128"; else F="--no-enable-chunked-prefill"; fi
  $BIN serve --port 8011 $F > /tmp/paged_infer_serve_$mode.log 2>&1 &
  SP=$!
  for i in $(seq 120); do curl -sf localhost:8011/health > /dev/null && break; sleep 1; done
  $BIN bench serving --base-url http://127.0.0.1:8011 --workload long-prompts --num-requests 16 --request-rate 4 --seed 7 \
    --no-progress > /dev/null  # warm-up, not kept
  for rate in 4 2 1; do
    $BIN bench serving --base-url http://127.0.0.1:8011 --workload long-prompts --num-requests 48 --request-rate $rate \
      --seed 0 --no-progress --out "$OUTPUT_DIR/smollm2-135m_long-prompts_n48_rate${rate}_$mode.json"
  done
  kill -TERM $SP; wait $SP || true
done
