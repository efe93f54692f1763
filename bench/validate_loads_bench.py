"""A whole ``validate``, one target load against three, side by side.

For each pair, ``validate`` runs twice per round, on the same prompts, without
``--hidden-states``: by default (both drafts swapped in one speculative engine, check 1
scored teacher-forced in it, check 6's ranges from forward hooks on the BF16 draft's linears
in the same runs: one target load) and with ``--reference-engine`` (a target-alone engine as
well: two). Two rounds, the second in reverse order; each mode's wall time is its smaller.
Then check 6 as it ran before, from a capture of the validation sequences (one more target
load), is timed on its own, twice: the reference engine plus that is the three-load path.
Recorded: wall times, target loads, where check 6's ranges came from, each check's verdict,
and whether every path gave the same verdicts.

Pairs: the toy pair, the toy target deepened by 56 zero layers (loading and running the
target then weigh as beside a real draft), and, with ``--smollm2 DIR`` (a folder written by
``eaglequant example smollm2`` with the FP8 export of ``make demo`` beside it, or
``--smollm2-fp8``), SmolLM2-135M-Instruct through its chat template.

    python bench/validate_loads_bench.py [--prompts 8] [--max-tokens 32] \
        [--smollm2 out/demo/pair --smollm2-fp8 out/demo/draft-fp8] \
        [--out bench/results-validate-loads.json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from toy_pair import TOY, export_fp8  # a sibling module: bench/ is on the path

HERE = Path(__file__).resolve().parent
ADDED_LAYERS = 56
MODES = ("one-load", "reference")


def measure(request: Any) -> dict[str, Any]:
    from eaglequant.validate.request import engine_prompts
    from eaglequant.validate.validation import scale_plausibility, validate_draft

    asked = {"one-load": request, "reference": replace(request, reference_engine=True)}
    modes: dict[str, Any] = {}
    generated: list[list[int]] = []
    for mode in [*MODES, *reversed(MODES)]:  # two rounds, the second in reverse order
        started = time.perf_counter()
        report = validate_draft(asked[mode])
        wall = time.perf_counter() - started
        six = next(c for c in report.checks if c.name.startswith("6"))
        generated = report.engines["bf16"]["token_ids"]
        record = modes.setdefault(mode, {"walls_s": []})
        record["walls_s"].append(round(wall, 1))
        record |= {
            "wall_s": min(record["walls_s"]),
            "target_loads": report.target_loads,
            "check_6_ranges_from": six.numbers.get("ranges_from"),
            "verdicts": {c.name: c.verdict for c in report.checks},
        }
    # Check 6 as it ran before its ranges came from the engine: a capture of the validation
    # sequences (one more target load), replayed through the draft module.
    bf16 = {"ok": True, "result": {"token_ids": generated}}
    walls, six = [], None
    for _ in range(2):
        started = time.perf_counter()
        six = scale_plausibility(request, {"bf16": bf16}, engine_prompts(request))  # type: ignore[arg-type]
        walls.append(round(time.perf_counter() - started, 1))
    assert six is not None and six.numbers.get("ranges_from") == "capture", six
    one, two = modes["one-load"], modes["reference"]
    three = round(two["wall_s"] + min(walls), 1)
    return {
        "modes": modes,
        "check_6_capture": {"walls_s": walls, "verdict": six.verdict},
        "three_loads_wall_s": three,  # the reference engine plus check 6's capture
        "wall_ratio_one_load_over_two": round(one["wall_s"] / two["wall_s"], 3),
        "wall_ratio_one_load_over_three": round(one["wall_s"] / three, 3),
        "same_verdicts": one["verdicts"] == two["verdicts"]
        and six.verdict == one["verdicts"]["6 scale plausibility"],
    }


def main() -> None:
    from eaglequant.prompts.source import load_prompts, parse_source
    from eaglequant.validate.request import ValidateRequest
    from eaglequant.validate.validation import read_prompts
    from eaglequant_examples.toy import deepen_target

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--smollm2", type=Path, help="a folder from `eaglequant example smollm2`")
    parser.add_argument("--smollm2-fp8", type=Path, help="the SmolLM2 draft's FP8 export")
    parser.add_argument("--out", type=Path, default=HERE / "results-validate-loads.json")
    args = parser.parse_args()
    toy_prompts = read_prompts(TOY / "prompts.jsonl")[: args.prompts]
    common = {"max_tokens": args.max_tokens, "engine_timeout_s": 900}
    with tempfile.TemporaryDirectory(prefix="validate-loads-bench-") as scratch:
        fp8 = export_fp8(Path(scratch) / "fp8")
        deep = deepen_target(TOY / "target", Path(scratch) / "deep", ADDED_LAYERS)
        toy = {"draft": fp8, "baseline": TOY / "draft", "prompts": toy_prompts}
        requests = {
            "toy": ValidateRequest(target=TOY / "target", **toy, **common),
            f"toy-deep-{4 + ADDED_LAYERS}-layers": ValidateRequest(target=deep, **toy, **common),
        }
        if args.smollm2 is not None and args.smollm2_fp8 is not None:
            source = load_prompts(parse_source(f"mt-bench:{args.prompts}"))
            requests["smollm2"] = ValidateRequest(
                target=args.smollm2 / "target",
                draft=args.smollm2_fp8,
                baseline=args.smollm2 / "draft",
                prompts=source.texts,
                chat_template=True,
                tie_margin=0.25,  # as the SmolLM2 demo runs it (docs/known-issues.md)
                **common,
            )
        results = {
            "prompts": args.prompts,
            "max_tokens": args.max_tokens,
            "pairs": {name: measure(request) for name, request in requests.items()},
        }
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
