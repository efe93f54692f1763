"""Hidden-state capture: the folder format, replica planning, and both engines on the toy target.

The vLLM tests run the real engine (``extract_hidden_states`` with the CPU
connector) in child processes. The layer-numbering proof: with the engine in
float32, vLLM's states for auxiliary id ``i`` equal transformers'
``hidden_states[i]`` within float32 rounding, so after both are stored as BF16
they differ by at most one BF16 rounding step.
"""

from __future__ import annotations

from pathlib import Path

from tests.support import capture_args, invoke


def test_capture_reserves_what_it_sets(tmp_path: Path) -> None:
    code, output = invoke(
        capture_args(tmp_path / "c", "--engine-arg", "enable_chunked_prefill=true")
    )
    assert code == 2
    assert output == (
        "error: engine argument 'enable_chunked_prefill' is set by eaglequant; use nothing: "
        "capture turns chunked prefill off, as vLLM requires instead\n"
    )
