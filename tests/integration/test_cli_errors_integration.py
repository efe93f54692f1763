"""Bad input through the CLI: exit 2, one line naming the problem, nothing written.

The input folder is checked byte for byte afterwards.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import assert_clean_failure, put_nan, run_cli_checked


@pytest.mark.parametrize(
    ("tensor", "recipe"),
    [
        ("midlayer.mlp.down_proj.weight", ["--calib", "none"]),
        # checked by the writer while it copies; Quark may run before it is reported
        pytest.param("lm_head.weight", ["--calib", "none"]),
        # file-to-file: no module at all
        pytest.param("embed_tokens.weight", ["--recipe", "ptpc-fp8"]),
    ],
)
def test_nan_weight_is_named(
    tiny_draft: Path, tmp_path: Path, tensor: str, recipe: list[str]
) -> None:
    put_nan(tiny_draft, tensor)
    code, output = run_cli_checked(["export", str(tiny_draft), str(tmp_path / "o"), *recipe])
    assert_clean_failure(code, output, f"tensor '{tensor}' holds 1 NaN/Inf")
    assert not (tmp_path / "o").exists() and list(tmp_path.iterdir()) == [tiny_draft]
