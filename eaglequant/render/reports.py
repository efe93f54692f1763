"""Markdown for the measured reports: validation (``validate --json``) and tuning (``tune``).

Both are rendered from their JSON form, so ``validate --markdown``, tune's
``results.md`` and the model card print the same tables from the same data.
"""

from __future__ import annotations

from typing import Any

PLOTS = ("throughput.png", "speedup.png", "acceptance.png")


def acceptance_rows(report: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(draft, mean acceptance length, by position, engine timings) for BF16 and FP8."""
    rows = []
    for role in ("bf16", "fp8"):
        engine = report["engines"].get(role, {})
        acc = engine.get("acceptance") or {}
        mean = acc.get("mean_length")
        per_pos = " / ".join(f"{p:.3f}" for p in acc.get("per_position", [])) or "-"
        timing = f"load {engine.get('load_s', '-')}s, generate {engine.get('generate_s', '-')}s"
        rows.append((role.upper(), "-" if mean is None else f"{mean:.3f}", per_pos, timing))
    return rows


def validation_markdown(report: dict[str, Any], heading: str = "##") -> str:
    """The validation report: setup, acceptance table, checks, verdict, serve line."""
    llm = report["engines"].get("fp8", {}).get("engine_config", {}).get("llm", {})
    lines = [
        f"{heading} Validation in vLLM speculative decoding (`eaglequant validate`)",
        "",
        f"Target `{report['target']}`, FP8 draft `{report['draft']}`, BF16 baseline "
        f"`{report['baseline']}`; `num_speculative_tokens={report['k']}`, {report['prompts']} "
        f"prompts x {report['max_tokens']} tokens, greedy"
        + (", `enforce_eager`" if llm.get("enforce_eager") else "")
        + f"; backend {report['backend']}"
        + (", CPU FP8 plugin active" if report["plugin_active"] else "")
        + ".",
        "",
    ]
    if report.get("serve_command"):
        lines += [f"Equivalent serve line: `{report['serve_command']}`", ""]
    config = report["engines"].get("fp8", {}).get("engine_config")
    if config:
        env = ", ".join(f"`{k}={v}`" for k, v in sorted(config["env"].items())) or "none"
        lines += [f"vLLM {config['vllm']}; environment: {env}.", ""]
    lines += ["| draft | mean acceptance length | acceptance by position | engine |"]
    lines += ["|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in acceptance_rows(report)]
    lines += ["", "| check | result | detail |", "|---|---|---|"]
    for check in report["checks"]:
        detail = check["detail"].replace("|", "\\|")
        lines.append(f"| {check['name']} | {'PASS' if check['passed'] else 'FAIL'} | {detail} |")
    verdict = "All checks passed" if report["passed"] else "Validation FAILED"
    return "\n".join([*lines, "", f"**{verdict}.**", ""])


def tune_markdown(summary: dict[str, Any]) -> str:
    """Throughput (speedup) per concurrency and k, and acceptance per k, as Markdown."""
    results = summary["results"]
    ks = [0, *summary["ks"]]
    header = ["concurrency"] + ["no spec" if k == 0 else f"k={k}" for k in ks] + ["best k"]
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for concurrency in summary["concurrencies"]:
        cells = [str(concurrency)]
        for k in ks:
            row = next(
                (r for r in results if r["k"] == k and r["concurrency"] == concurrency), None
            )
            if row is None:
                cells.append("-")
            elif k == 0 or row["speedup"] is None:
                cells.append(f"{row['output_throughput']:.1f}")
            else:
                cells.append(f"{row['output_throughput']:.1f} ({row['speedup']:.2f}x)")
        cells.append(str(summary["recommended_k"].get(str(concurrency), "-")))
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "| k | mean acceptance length | acceptance by position |", "|---|---|---|"]
    for k in summary["ks"]:
        rows = [r for r in results if r["k"] == k and r["acceptance_length"] is not None]
        if not rows:
            continue
        mean = sum(r["acceptance_length"] for r in rows) / len(rows)
        per_pos = mean_positions(rows)
        lines.append(f"| {k} | {mean:.3f} | {' / '.join(f'{p:.3f}' for p in per_pos)} |")
    return "\n".join(lines) + "\n"


def mean_positions(rows: list[dict[str, Any]]) -> list[float]:
    """Acceptance rate by draft position, averaged over the rows (concurrencies) of one k."""
    width = max(len(r["per_position"]) for r in rows)
    sums = [0.0] * width
    for r in rows:
        for i, value in enumerate(r["per_position"]):
            sums[i] += value
    return [s / len(rows) for s in sums]
