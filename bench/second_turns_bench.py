"""MT-Bench's categories judged on first turns, second turns and both, side by side, from
``validate --second-turns`` reports.

Each report holds every prompt's per-prompt spec-decode counts for both drafts (first turns,
then the second turns after the target's own answers). This script judges checks 2 and 5 per
category, exactly as ``validate`` does (``validate.categories.by_category``: the same
paired bootstrap, thresholds and minimum draft tokens), on three subsets of the same runs:

- first turns only (what ``validate`` measures without ``--second-turns``),
- second turns only,
- both (what ``validate --second-turns`` judged; its table is reproduced as a check),

and writes one Markdown table per report and subset, with each category's verdicts,
intervals and, where undecided, the prompts that would decide it, plus the run's wall time
when given.

    python bench/second_turns_bench.py 128=report-128.json 256=report-256.json \\
        --wall 128=1234 --wall 256=2345 --out results.md
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from eaglequant.results.validation_report import (
    CategoryRow,
    Check,
    CheckId,
    ValidationReport,
    read_report,
)
from eaglequant.validate.acceptance_checks import AcceptanceThresholds, acceptance_checks
from eaglequant.validate.categories import by_category, prompts_to_decide
from eaglequant.validate.stats import MAX_PROMPTS_FACTOR, PromptCounts

SUBSETS = ("first turns", "second turns", "both")
COLUMNS = (
    "category",
    "prompts",
    "BF16 / FP8 mean acceptance",
    "check 2: FP8/BF16 [95% interval]",
    "check 2",
    "check 5: lowest position [95% interval]",
    "check 5",
)


def _counts(report: ValidationReport, role: str) -> list[PromptCounts]:
    per_prompt = report.engines[role].per_prompt
    if per_prompt is None or any(p is None for p in per_prompt):
        raise SystemExit(f"{role}: the report holds no per-prompt counts")
    return [PromptCounts.from_json(p) for p in per_prompt if p is not None]


def _thresholds(report: ValidationReport) -> AcceptanceThresholds:
    """The ratios the report's checks 2 and 5 were judged at (their numbers)."""
    two, five = report.check(CheckId.ACCEPTANCE), report.check(CheckId.PER_POSITION)
    if two is None or five is None:
        raise SystemExit("the report has no checks 2 and 5 (an engine failed)")
    return AcceptanceThresholds(
        min_acceptance_ratio=float(two.numbers["threshold"]),
        min_position_ratio=float(five.numbers["threshold"]),
    )


def subsets(report: ValidationReport) -> dict[str, list[int]]:
    """The prompt indices of each subset (a report without second turns: its first turns)."""
    if report.second_turns is None:
        return {"first turns": list(range(report.prompts))}
    first = report.second_turns["first_turns"]
    return {
        "first turns": list(range(first)),
        "second turns": list(range(first, report.prompts)),
        "both": list(range(report.prompts)),
    }


def judge(
    report: ValidationReport, indices: Sequence[int]
) -> tuple[dict[str, CategoryRow], list[Check]]:
    """Checks 2 and 5 per category and overall on the prompts ``indices``."""
    if report.prompt_categories is None or report.min_category_drafts is None:
        raise SystemExit("the report has no categories")
    thresholds = _thresholds(report)
    counts = {role: _counts(report, role) for role in ("bf16", "fp8")}
    subset = {role: [counts[role][i] for i in indices] for role in counts}
    categories = [report.prompt_categories[i] for i in indices]
    table = by_category(
        categories, subset, min_drafts=report.min_category_drafts, thresholds=thresholds
    )
    overall = acceptance_checks(subset["fp8"], subset["bf16"], thresholds)
    return table, overall


def _verdict(check: Check) -> str:
    if check.verdict != "INCONCLUSIVE":
        return check.verdict
    needed = prompts_to_decide(check)
    if needed is None:
        return f"INCONCLUSIVE (not even {MAX_PROMPTS_FACTOR}x its prompts would decide)"
    return f"INCONCLUSIVE (~{needed} prompts would decide)"


def _lowest(check: Check) -> str:
    intervals = check.intervals
    if not intervals:
        return "-"
    position = min(range(len(intervals)), key=lambda p: intervals[p].low)
    return f"pos {position + 1}: {intervals[position].describe()}"


def table_lines(table: dict[str, CategoryRow], overall: list[Check]) -> list[str]:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    rows = [(name, row.prompts, row.bf16, row.fp8, row.checks) for name, row in table.items()]
    for name, prompts, bf16, fp8, checks in rows:
        means = f"{bf16.mean_length:.3f} / {fp8.mean_length:.3f}"
        if checks is None:
            lines.append(f"| {name} | {prompts} | {means} | not judged | | | |")
            continue
        two, five = checks
        cells = [two.intervals[0].describe(), _verdict(two), _lowest(five), _verdict(five)]
        lines.append(f"| {name} | {prompts} | {means} | " + " | ".join(cells) + " |")
    two, five = overall
    prompts = sum(row.prompts for row in table.values())
    cells = [two.intervals[0].describe(), _verdict(two), _lowest(five), _verdict(five)]
    lines.append(f"| **all** | {prompts} | | " + " | ".join(cells) + " |")
    decided = sum(
        1
        for row in table.values()
        if row.checks and all(c.verdict != "INCONCLUSIVE" for c in row.checks)
    )
    lines += ["", f"Categories decided on both checks: {decided} of {len(table)}."]
    return lines


def report_markdown(name: str, report: ValidationReport, wall_s: float | None) -> list[str]:
    second = report.second_turns
    lines = [f"### {name}: `--max-tokens {report.max_tokens}`", ""]
    timing = (
        f"load {report.load_s:.0f} s, generate {report.generate_s:.0f} s (of which check 1's "
        f"scoring {report.score_s:.0f} s)"
    )
    if wall_s is not None:
        timing = f"wall {wall_s:.0f} s for the whole validate; " + timing
    workload = f"k={report.k}, {report.max_tokens} tokens each (EOS ignored), greedy; {timing}."
    if second is None:
        lines += [f"{report.prompts} first turns, {workload}", ""]
    else:
        lines += [
            f"{report.prompts} prompts ({second['first_turns']} first turns, "
            f"{len(second['of'])} second turns), {workload} Answers: {second['answered_by']}, "
            f"{second['answer_tokens_mean']} tokens on average (at most "
            f"{second['answer_tokens_max']}), {second['stopped_at_eos']} of {len(second['of'])} "
            f"ended at EOS before {second['answer_cap']}.",
            "",
        ]
    for label, indices in subsets(report).items():
        table, overall = judge(report, indices)
        if len(indices) == report.prompts and report.categories is not None:
            assert {n: r.to_json() for n, r in table.items()} == {
                n: r.to_json() for n, r in report.categories.items()
            }, "the re-judged table differs from the report's"
        lines += [f"**{label}** ({len(indices)} prompts)", "", *table_lines(table, overall), ""]
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", nargs="+", metavar="NAME=REPORT")
    parser.add_argument("--wall", action="append", default=[], metavar="NAME=SECONDS")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    walls = {k: float(v) for k, v in (w.split("=", 1) for w in args.wall)}
    lines: list[str] = []
    for item in args.reports:
        name, path = item.split("=", 1)
        lines += report_markdown(name, read_report(Path(path)), walls.get(name))
    text = "\n".join(lines)
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
