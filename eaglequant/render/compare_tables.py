"""``compare``'s tables (``compare.md``, and the card's section): per prompt set, one row
per candidate against the BF16 draft, each candidate's categories, the recommendation."""

from __future__ import annotations

from dataclasses import replace

from eaglequant.render.reports import folder_name, number_text
from eaglequant.render.validation_tables import category_markdown
from eaglequant.results.compare_report import CandidateRow, CompareReport, PromptSetSummary
from eaglequant.results.workload import AcceptanceWorkload


def compare_markdown(report: CompareReport, heading: str = "##") -> str:
    """``compare``'s tables: per prompt set, one row per candidate against the BF16 draft (and
    each candidate's categories, when the set has them), then the recommendation."""
    lines = [
        f"{heading} Which format to ship (`eaglequant compare`)",
        "",
        f"BF16 draft `{folder_name(report.baseline)}` ({report.baseline_bytes} bytes) on "
        f"target `{folder_name(report.target)}`; `num_speculative_tokens={report.k}`, "
        f"{report.max_tokens} tokens a prompt, greedy.",
    ]
    for prompt_set in report.prompt_sets:
        rows = [r for r in report.rows if r.prompt_set == prompt_set.source]
        lines += ["", *_compare_set(prompt_set, rows)]
    failures = [
        f"- `{r.recipe}` on `{folder_name(r.prompt_set)}`: {r.failure}"
        for r in report.rows
        if r.failure
    ]
    if failures:
        lines += ["", "Why the other candidates did not pass:", "", *failures]
    engines = f"Engines: {report.engine_mode}, target loaded {report.target_loads}x"
    if report.engine_fallback:
        engines += f" (some drafts in engines of their own: {report.engine_fallback})"
    lines += ["", engines + "."]
    chosen, reason = report.recommended, report.recommendation_reason
    closing = (
        f"**Recommended: `{chosen}`**" + (f" ({reason})." if reason else ".")
        if chosen
        else "**No candidate passed.**"
    )
    return "\n".join([*lines, "", closing, ""])


def _workload_text(workload: AcceptanceWorkload | None, name: str) -> str:
    """The acceptance's workload label (a file by its name), or nothing for an older report."""
    return f"; workload: {replace(workload, prompt_set=name).describe()}" if workload else ""


def _compare_set(prompt_set: PromptSetSummary, rows: list[CandidateRow]) -> list[str]:
    """One prompt set's table, and its candidates' category tables."""
    bf16_pos = " / ".join(f"{p:.3f}" for p in prompt_set.baseline_per_position) or "-"
    name = folder_name(prompt_set.source)  # a file by its name: the table goes into cards
    lines = [
        f"Prompts `{name}` ({prompt_set.prompts} prompts, sha256 "
        f"`{prompt_set.sha256[:16]}`): BF16 mean acceptance length "
        f"{number_text(prompt_set.baseline_mean_acceptance)}, by position {bf16_pos}"
        f"{_workload_text(prompt_set.workload, name)}.",
        "",
        "| candidate | format | draft KV cache | bytes | vs BF16 | params quantized | lossless "
        "| mean acceptance | by position | vs BF16 | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        per_pos = " / ".join(f"{p:.3f}" for p in row.per_position) or "-"
        if row.position_intervals:  # FP8/BF16 by position, as check 5 judged it
            per_pos += " (vs BF16 " + " / ".join(i.describe() for i in row.position_intervals) + ")"
        ratio = (
            row.acceptance_interval.describe()
            if row.acceptance_interval
            else number_text(row.acceptance_ratio)
        )
        verdict = "PASS" if row.passed else row.verdict
        verdict += "" if row.passed else " (" + ", ".join(row.failed_checks) + ")"
        made = " (ready-made)" if row.ready_made else ""
        lines.append(
            f"| `{row.recipe}`{made} | {row.scheme} | {row.kv_cache_dtype} | "
            f"{row.bytes_on_disk} | {row.bytes_ratio:.3f} | "
            f"{row.quantized_fraction:.1%} | {'yes' if row.lossless else 'NO'} | "
            f"{number_text(row.mean_acceptance)} | {per_pos} | {ratio} "
            f"(>= {row.min_acceptance_ratio}) | {verdict} |"
        )
    for row in rows:
        if row.categories:
            lines += ["", f"`{row.recipe}` on `{name}` by category:", ""]
            lines += category_markdown(row.categories, row.min_category_drafts)[:-1]
    return lines
