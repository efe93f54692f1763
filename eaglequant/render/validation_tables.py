"""The validation report's tables (``validate --markdown``, the terminal, the model card)
and the per-category table compare shares, read from a :class:`ValidationReport`."""

from __future__ import annotations

from collections.abc import Mapping

from eaglequant.prompts.turns import describe as describe_second_turns
from eaglequant.results.engine_result import EngineRecord
from eaglequant.results.environment import reproducing_env
from eaglequant.results.validation_report import (
    ADVISORY_WHEN_UNDECIDED,
    FAIL,
    INCONCLUSIVE,
    PASS,
    CategoryRow,
    CheckId,
    ValidationReport,
)

CATEGORY_COLUMNS = (
    "category",
    "prompts",
    "draft tokens BF16 / FP8",
    "BF16 mean acceptance",
    "FP8 mean acceptance",
    "FP8/BF16 [95% interval]",
    "by position FP8:BF16",
    "checks 2 and 5",
)
VERDICT_LINES = {
    PASS: "All checks passed",
    FAIL: "Validation FAILED",
    INCONCLUSIVE: "Validation INCONCLUSIVE (too few prompts to decide)",
}


def acceptance_rows(report: ValidationReport) -> list[tuple[str, str, str, str]]:
    """(draft, mean acceptance length, by position, engine timings) for BF16 and FP8."""
    rows = []
    for role in ("bf16", "fp8"):
        engine = report.engines.get(role)
        acc = engine.acceptance if engine else None
        mean = acc.mean_length if acc else None
        per_pos = " / ".join(f"{p:.3f}" for p in acc.per_position) if acc else ""
        load, generate = (engine.load_s, engine.generate_s) if engine else (None, None)
        timing = f"load {_or_dash(load)}s, generate {_or_dash(generate)}s"
        rows.append((role.upper(), "-" if mean is None else f"{mean:.3f}", per_pos or "-", timing))
    return rows


def workload_line(report: ValidationReport) -> str:
    """The workload the acceptance rows were measured on (and checks 2 and 5's, if sampled)."""
    line = f"Acceptance workload: {report.workload().describe()}"
    if report.temperature:
        line += f"; checks 2 and 5: {report.workload(sampled=True).describe()}"
    return line + "."


def _or_dash(value: object) -> str:
    return "-" if value is None else str(value)


def category_rows(categories: Mapping[str, CategoryRow] | None) -> list[tuple[str, ...]]:
    """Per category: prompts, draft tokens, BF16 and FP8 mean acceptance, ratio, by position,
    and whether the checks judged it (and how)."""
    rows = []
    for name, row in (categories or {}).items():
        bf16, fp8 = row.bf16, row.fp8
        means = (bf16.mean_length, fp8.mean_length)
        ratio = "-"
        if means[0] and means[1] is not None:
            ratio = f"{means[1] / means[0]:.3f}"
        verdicts = "reported, not judged"
        if row.checks:
            two, five = row.checks
            interval = two.intervals[0]
            ratio += f" [{interval.low:.3f}, {interval.high:.3f}]"
            verdicts = f"2 {two.verdict}, 5 {five.verdict}"
        positions = " / ".join(
            f"{f:.3f}:{b:.3f}" for f, b in zip(fp8.per_position, bf16.per_position, strict=False)
        )
        rows.append(
            (
                name,
                str(row.prompts),
                f"{bf16.draft_tokens} / {fp8.draft_tokens}",
                *("-" if m is None else f"{m:.3f}" for m in means),
                ratio,
                positions or "-",
                verdicts,
            )
        )
    return rows


def category_markdown(
    categories: Mapping[str, CategoryRow] | None, min_category_drafts: int | None
) -> list[str]:
    """The per-category table (no lines when there are no categories)."""
    rows = category_rows(categories)
    if not rows:
        return []
    lines = ["| " + " | ".join(CATEGORY_COLUMNS) + " |", "|" + "---|" * len(CATEGORY_COLUMNS)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    note = (
        f"Categories with fewer than {min_category_drafts} draft tokens are reported, not judged."
    )
    return [*lines, "", note, ""]


def prompts_line(report: ValidationReport) -> str:
    """Which prompts, identified by sha256, how they were rendered, and any calibration overlap."""
    source = report.prompt_set
    text = (
        f"Prompts: `{source['source']}` (sha256 `{source['sha256']}`)"
        if source
        else "Prompts: given in the request"
    )
    text += (
        ", rendered with the target's chat template."
        if report.chat_template
        else ", sent raw (no chat template)."
    )
    overlap = report.calibration_overlap
    if overlap and overlap["shared"]:
        text += (
            f" **{overlap['shared']} of {overlap['prompts']} prompts are among the draft's "
            f"calibration texts** (`{overlap['calibration']}`): a draft validated on its own "
            "calibration prompts proves less."
        )
    elif overlap:
        text += f" None is among the draft's calibration texts (`{overlap['calibration']}`)."
    if report.second_turns:
        text += " " + describe_second_turns(report.second_turns)
    return text


def _fp8_config(report: ValidationReport) -> EngineRecord | None:
    fp8 = report.engines.get("fp8")
    return fp8.engine_config if fp8 else None


VALIDATION_TITLE = "Validation in vLLM speculative decoding (`eaglequant validate`)"
SETS_COLUMNS = (
    "prompts",
    "count",
    "BF16 / FP8 mean acceptance",
    "FP8/BF16 [95% interval]",
    "by position FP8/BF16 [95% interval]",
    "categories",
    "verdict",
)


def set_title(report: ValidationReport) -> str:
    """A report's heading among several: its prompt set."""
    source = report.prompt_set["source"] if report.prompt_set else "the request's prompts"
    return f"On `{source}`"


def validation_sets_markdown(reports: list[ValidationReport]) -> str:
    """One row per report (each on its own prompt set): acceptance, its ratio with the
    interval checks 2 and 5 judged, the categories' outcome and the verdict."""
    lines = [f"## {VALIDATION_TITLE}", "", "Each prompt set's run, in detail below.", ""]
    lines += ["| " + " | ".join(SETS_COLUMNS) + " |", "|" + "---|" * len(SETS_COLUMNS)]
    lines += ["| " + " | ".join(_set_row(report)) + " |" for report in reports]
    return "\n".join([*lines, ""])


def _set_row(report: ValidationReport) -> tuple[str, ...]:
    source = report.prompt_set["source"] if report.prompt_set else "-"
    means = {role: mean for role, mean, _, _ in acceptance_rows(report)}
    acceptance = report.check(CheckId.ACCEPTANCE)
    per_position = report.check(CheckId.PER_POSITION)
    ratio = acceptance.intervals[0].describe() if acceptance and acceptance.intervals else "-"
    positions = " / ".join(i.describe() for i in per_position.intervals) if per_position else ""
    verdicts = f"{acceptance.verdict}" if acceptance else "-"
    return (
        f"`{source}`",
        str(report.prompts),
        f"{means['BF16']} / {means['FP8']}",
        f"{ratio} {verdicts}",
        positions or "-",
        _categories_cell(report),
        report.verdict,
    )


def _categories_cell(report: ValidationReport) -> str:
    if not report.categories:
        return "none"
    failed = [
        str(c.name)
        for c in report.checks
        if c.name in ADVISORY_WHEN_UNDECIDED and c.verdict == FAIL
    ]
    text = f"{len(report.categories)}; " + (
        f"FAIL: {', '.join(failed)}" if failed else "none FAILs"
    )
    undecided = report.undecided_categories
    return text + (f"; undecided: {', '.join(undecided)}" if undecided else "")


def decoding_text(report: ValidationReport) -> str:
    """How the runs decoded: ``greedy``, or the sampled runs checks 2 and 5 judged."""
    if not report.temperature:
        return "greedy"
    seeds = ", ".join(str(s) for s in report.sampling_seeds)
    return (
        f"greedy, and checks 2 and 5 on runs sampled at temperature {report.temperature:g} "
        f"(seeds {seeds}; each prompt's counts summed over them)"
    )


def validation_markdown(
    report: ValidationReport, heading: str = "##", title: str = VALIDATION_TITLE
) -> str:
    """The validation report: setup, acceptance table, checks, verdict, serve line."""
    config = _fp8_config(report)
    llm = config["llm"] if config else {}
    lines = [
        f"{heading} {title}",
        "",
        f"Target `{report.target}`, FP8 draft `{report.draft}`, BF16 baseline "
        f"`{report.baseline}`; `num_speculative_tokens={report.k}`, {report.prompts} "
        f"prompts x {report.max_tokens} tokens, {decoding_text(report)}"
        + (", `enforce_eager`" if llm.get("enforce_eager") else "")
        + f"; backend {report.backend}"
        + (", CPU FP8 plugin active" if report.plugin_active else "")
        + ".",
        "",
    ]
    lines += [prompts_line(report), ""]
    if report.serve_command:
        lines += [f"Equivalent serve line: `{report.serve_command}`", ""]
    if config:
        kept = reproducing_env(config["env"])  # the JSON keeps all, per-run random ones too
        env = ", ".join(f"`{k}={v}`" for k, v in sorted(kept.items())) or "none"
        lines += [f"vLLM {config['vllm']}; environment: {env}.", ""]
    run = "greedy " if report.temperature else ""  # checks 2 and 5 judged the sampled runs
    lines += [f"| draft | {run}mean acceptance length | {run}acceptance by position | engine |"]
    lines += ["|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in acceptance_rows(report)]
    lines += ["", workload_line(report), ""]
    lines += [*category_markdown(report.categories, report.min_category_drafts)]
    lines += ["| check | result | detail |", "|---|---|---|"]
    for check in report.checks:
        detail = check.detail.replace("|", "\\|")
        lines.append(f"| {check.name} | {check.verdict} | {detail} |")
    verdict = VERDICT_LINES[report.verdict]
    return "\n".join([*lines, "", f"**{verdict}.**", ""])
