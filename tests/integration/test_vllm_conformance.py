"""Every vLLM internal eaglequant relies on exists in the installed vLLM, as it was read.

The installed sources are read, not run: Model Runner V2 (``v1/worker/gpu/``) cannot run
on this CPU (it needs a Triton CPU backend), but its runner and speculator are checked
like V1's, so a vLLM upgrade that moves any of them fails here, not at a user's.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

from eaglequant.engine import vllm_internals as internals
from eaglequant.engine import vllm_source
from eaglequant.engine.config import probe_vllm


@pytest.mark.parametrize("hook", internals.HOOKS, ids=lambda h: h.key)
def test_the_installed_vllm_has_the_hook(hook: internals.Hook) -> None:
    assert internals.missing_hooks((hook.key,)) == [], f"vllm/{hook.file}: {hook.member}"


def test_each_hook_names_the_file_it_was_read_from() -> None:
    root = Path(importlib.util.find_spec("vllm").origin).parent.parent  # type: ignore[union-attr]
    for hook in internals.HOOKS:
        path = root / hook.file
        assert path.is_file() or (path.with_suffix("") / "__init__.py").is_file(), hook.file


def test_a_renamed_member_of_the_real_runner_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    real = vllm_source._source

    def renamed(module: str) -> ast.Module | None:
        tree = real(module)
        if module != internals.V2_RUNNER.split(":")[0] or tree is None:
            return tree
        text = ast.unparse(tree).replace("self.speculator", "self.drafter_v3")
        return ast.parse(text)

    monkeypatch.setattr(vllm_source, "_source", renamed)
    assert [h.key for h in internals.missing_hooks(("v2.speculator", "v1.drafter"))] == [
        "v2.speculator"
    ]


def test_the_probe_reports_every_feature_on_with_this_vllm() -> None:
    install = probe_vllm(sys.executable)
    assert install.version.startswith(internals.SUPPORTED[0])
    assert set(install.missing_hooks) == set(internals.FEATURES)
    assert {f: k for f, k in install.missing_hooks.items() if k} == {}
    assert internals.version_warning(install.version) == ""
