"""The one home of vLLM's internals: its source probe, its gates and its accessors.

The probe reads sources; here they are small stand-ins (the installed vLLM's own are read
in ``tests/integration/test_vllm_conformance.py``). Model Runner V2 cannot run on this CPU,
so its runner is a stand-in class carrying V2's module and class name.
"""

from __future__ import annotations

import ast
import json
import logging
import textwrap
from types import SimpleNamespace
from typing import Any

import pytest

from eaglequant.engine import cpu_fp8_plugin as plugin
from eaglequant.engine import vllm_internals as internals
from eaglequant.engine import vllm_source
from eaglequant.errors import InputError

RUNNER = """
class GPUModelRunner:
    def __init__(self, config):
        self.drafter = None
        self.kv_cache_config: object = None

    def initialize_kv_cache(self, kv_cache_config, kernel_block_sizes):
        self._kernel_block_sizes = kernel_block_sizes
"""
PROPOSER = """
class SpecDecodeBaseProposer:
    def load_model(self, target_model):
        self.model = target_model
        self._draft_attn_layer_names = set()

    def initialize_attn_backend(self, kv_cache_config, kernel_block_sizes=None):
        pass
"""


@pytest.fixture
def sources(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    texts = {
        "vllm.v1.worker.gpu_model_runner": RUNNER,
        "vllm.v1.spec_decode.llm_base_proposer": PROPOSER,
    }

    def parsed(module: str) -> ast.Module | None:
        return ast.parse(textwrap.dedent(texts[module])) if module in texts else None

    monkeypatch.setattr(vllm_source, "_source", parsed)
    return texts


def _missing(*keys: str) -> list[str]:
    return [h.key for h in internals.missing_hooks(keys)]


def test_the_probe_finds_methods_and_attributes_a_class_assigns(sources: dict[str, str]) -> None:
    assert _missing(*internals.FEATURES["draft swap"][:6]) == []


def test_a_renamed_attribute_or_changed_signature_is_missing(sources: dict[str, str]) -> None:
    sources["vllm.v1.worker.gpu_model_runner"] = RUNNER.replace("self.drafter", "self.proposer")
    sources["vllm.v1.spec_decode.llm_base_proposer"] = PROPOSER.replace(
        "kv_cache_config, kernel_block_sizes=None", "kv_cache_config, block_sizes=None"
    )
    missing = _missing("v1.drafter", "v1.proposer.initialize_attn_backend", "v1.proposer.model")
    assert missing == ["v1.drafter", "v1.proposer.initialize_attn_backend"]


def test_a_module_absent_from_the_install_lacks_every_hook(sources: dict[str, str]) -> None:
    assert _missing("bench.serve", "v2.speculator") == ["bench.serve", "v2.speculator"]


def test_a_gated_feature_names_what_this_vllm_lacks() -> None:
    missing = {"draft swap": ["v1.kernel_block_sizes"], "benchmark client": []}
    assert internals.gate(missing, "benchmark client") == ""
    assert internals.gate(missing, "draft swap") == (
        "draft swap is off: this vLLM lacks GPUModelRunner._kernel_block_sizes "
        "(read in vLLM 0.32.0, 0.33.0)"
    )


def test_a_command_is_refused_only_when_every_feature_it_can_use_is_off() -> None:
    from eaglequant.engine.config import VllmInstall

    v1, v2 = "layer inspection (V1 runner)", "layer inspection (Model Runner V2)"
    install = VllmInstall("cuda", frozenset(), missing_hooks={v1: (), v2: ("v2.speculator",)})
    install.require("validate", v1, v2)
    install = VllmInstall(
        "cuda", frozenset(), missing_hooks={v1: ("v1.drafter",), v2: ("v2.speculator",)}
    )
    with pytest.raises(InputError) as refused:
        install.require("validate", v1, v2)
    assert str(refused.value) == (
        "validate cannot run here: layer inspection (V1 runner) is off: this vLLM lacks "
        "GPUModelRunner.drafter (read in vLLM 0.32.0, 0.33.0)"
    )


def test_a_vllm_outside_the_range_gets_one_line() -> None:
    assert internals.version_warning("0.32.0") == ""
    assert internals.version_warning("0.32.3.dev1+cpu") == ""
    line = internals.version_warning("0.29.1")
    assert line.startswith("vLLM 0.29.1 is outside the tested range >=0.32,<0.34: ")
    assert internals.version_warning("1.0.0").startswith("vLLM 1.0.0 is outside")


class GPUModelRunner:  # Model Runner V2's name and module, as a stand-in (it needs a GPU)
    def __init__(self, speculator: Any) -> None:
        self.speculator = speculator


GPUModelRunner.__module__ = "vllm.v1.worker.gpu.model_runner"


def test_the_draft_model_is_read_from_either_runner() -> None:
    draft = object()
    v1 = SimpleNamespace(model_runner=SimpleNamespace(drafter=SimpleNamespace(model=draft)))
    v2 = SimpleNamespace(model_runner=GPUModelRunner(SimpleNamespace(model=draft)))
    assert internals.draft_model(v1) is draft
    assert internals.draft_model(v2) is draft
    assert internals.is_v2(v2.model_runner) and not internals.is_v2(v1.model_runner)


def test_a_missing_runner_attribute_is_a_named_error_not_an_empty_answer() -> None:
    worker = SimpleNamespace(model_runner=SimpleNamespace(proposer=None))
    with pytest.raises(internals.MissingHook) as missing:
        internals.draft_model(worker)
    assert str(missing.value) == (
        "this vLLM has no GPUModelRunner.drafter (read in vLLM 0.32.0, 0.33.0 from "
        "vllm/v1/worker/gpu_model_runner.py): the draft model (V1 runner) is unavailable"
    )
    with pytest.raises(internals.MissingHook, match=r"no GPUModelRunner\.speculator"):
        internals.draft_model(SimpleNamespace(model_runner=GPUModelRunner.__new__(GPUModelRunner)))


def test_missing_kv_scales_are_a_named_error() -> None:
    with pytest.raises(internals.MissingHook, match="_k_scale_float"):
        internals.kv_scales(SimpleNamespace(_v_scale_float=1.0))
    assert internals.kv_scales(SimpleNamespace(_k_scale_float=2, _v_scale_float=0.5)) == (2.0, 0.5)


def test_the_swap_under_model_runner_v2_is_refused_by_name() -> None:
    with pytest.raises(internals.MissingHook) as refused:
        internals.draft_proposer(GPUModelRunner(SimpleNamespace(model=None)))
    assert "DraftModelSpeculator.set_attn" in str(refused.value)
    assert "binds the draft's attention groups once, with the target's" in str(refused.value)


def test_a_plugin_patch_whose_target_moved_is_logged_and_left_out(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[str] = []

    def list_mxfp8_on_cpu() -> None:
        calls.append("ran")

    monkeypatch.setattr(vllm_source, "_source", lambda _module: None)  # nothing is where it was
    with caplog.at_level(logging.WARNING, logger=plugin.LOGGER):
        assert plugin._guarded(list_mxfp8_on_cpu) == plugin.FAILED
    assert calls == []  # never patched half-way
    assert caplog.messages == [
        "eaglequant CPU plugin: list_mxfp8_on_cpu not applied (this vLLM lacks "
        "vllm.model_executor.kernels.linear._POSSIBLE_MXFP8_KERNELS, "
        "vllm.model_executor.layers.quantization.utils.mxfp8_utils._mxfp8_e4m3_quantize_torch); "
        "vLLM serves everything that does not need it"
    ]


def test_every_plugin_patch_and_feature_names_known_hooks() -> None:
    names = {p.__name__ for p in plugin.PATCHES}
    assert set(internals.PLUGIN_HOOKS) == names
    for keys in internals.FEATURES.values():
        assert keys and all(k in internals.BY_KEY for k in keys)


def test_the_hook_table_in_the_docs_lists_every_hook_and_no_other() -> None:
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "verification.md").read_text()
    rows = [line for line in doc.splitlines() if line.startswith("| `") and "`vllm/" in line]
    listed = [row.split("`")[1] for row in rows]
    assert sorted(listed) == sorted(hook.key for hook in internals.HOOKS)


def test_the_probe_warns_once_for_a_vllm_outside_the_range(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import subprocess

    from eaglequant.engine import config

    answer = ["cpu", ["model"], "", 0, "", ["CPU_ATTN"], "0.31.0", {"draft swap": []}]
    done = subprocess.CompletedProcess([], 0, stdout=json.dumps(answer) + "\n", stderr="")
    monkeypatch.setattr(config.subprocess, "run", lambda *_a, **_k: done)
    config.probe_vllm.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="eaglequant"):
            install = config.probe_vllm("python-0.31")
            config.probe_vllm("python-0.31")
    finally:
        config.probe_vllm.cache_clear()
    assert install.version == "0.31.0" and install.gate("draft swap") == ""
    assert caplog.messages == [internals.version_warning("0.31.0")]
