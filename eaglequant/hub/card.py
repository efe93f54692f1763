"""``eaglequant card``: the Hugging Face model card of an exported FP8 draft, from measured data.

Reads the folder's config and ``eaglequant.json`` manifest, optionally a
validation report (``validate --json``) and a tuning folder (``tune --out``),
and writes ``README.md`` with YAML front matter into the folder (atomically),
copying the tuning plots beside it, so the folder is ready for ``eaglequant publish``.

The card speaks only for the bytes it describes: every file must match the
manifest, and a validation report must have validated exactly those files. It
names no path of this machine: the target is named by its Hub id, the draft by
the repository id, prompts by their count, commands with placeholders. Its last
line records the digest of the files and of the report it was rendered from.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from eaglequant.errors import InputError
from eaglequant.hub.public import NO_REPO_ID, PublicNames, local_paths, public
from eaglequant.io.checkpoint import read_checkpoint
from eaglequant.io.model_config import DraftConfig
from eaglequant.io.output import write_text_atomic
from eaglequant.io.readback import sha256_file
from eaglequant.render.compare_tables import compare_markdown
from eaglequant.render.reports import PLOTS, tune_markdown
from eaglequant.render.validation_tables import (
    set_title,
    validation_markdown,
    validation_sets_markdown,
)
from eaglequant.results.binding import bound_files, files_digest, first_difference
from eaglequant.results.compare_report import COMPARE_JSON, CompareReport, read_compare_report
from eaglequant.results.environment import environment, environment_markdown
from eaglequant.results.manifest import CalibrationRecord, Manifest, read_json_object, read_manifest
from eaglequant.results.provenance import ABSOLUTE_PATH, machine_paths
from eaglequant.results.tune_summary import COMPARISON, SWEEP, TuneSummary, tune_summary
from eaglequant.results.validation_report import ValidationReport, read_report
from eaglequant.rules.exclusions import predict_fates
from eaglequant.rules.speculative import SpeculativeDict, schedule_config, speculative_config

CARD_FILE = "README.md"
# The last line of the card: what it was rendered from, for ``eaglequant publish``.
RECORD_PREFIX = "<!-- eaglequant card: "
RECORD = re.compile(r"^<!-- eaglequant card: (\{.*\}) -->$", re.MULTILINE)


def write_card(
    folder: Path,
    *,
    base_model: str,
    validations: Sequence[Path] = (),
    tune_dir: Path | None = None,
    license_id: str | None = None,
    repo_id: str | None = None,
    compare_dir: Path | None = None,
) -> Path:
    """Render and write ``README.md`` into ``folder``; InputError before writing anything when
    a file differs from the manifest or a validation report is about other bytes.

    ``validations``: one report per prompt set (the first one's run is the card's usage,
    environment and reproduce line); with more than one, a table gives each set's row."""
    config = read_checkpoint(folder).flat_config  # as vLLM reads it, in any draft format
    if "quantization_config" not in config:
        raise InputError(f"{folder}: no quantization_config; run the card on an exported FP8 draft")
    manifest = read_manifest(folder)
    files = bound_files(folder)
    reports = read_validations(validations, files, folder)
    tuning = read_json_object(tune_dir / "results.json", "tuning results") if tune_dir else None
    license_id = license_id or source_license(Path(manifest.get("source", "")))
    comparison = None
    if compare_dir:
        comparison = read_compare_report(compare_dir / COMPARE_JSON)
    names = PublicNames(base_model=base_model, repo_id=repo_id or NO_REPO_ID)
    text = render(
        folder, names, config, manifest, reports, tuning, license_id, comparison=comparison
    )
    digests = [sha256_file(path) for path in validations]
    record: dict[str, str | list[str] | None] = {
        "files_sha256": files_digest(files),
        "validation_sha256": digests[0] if digests else None,
        "repo_id": repo_id,
    }
    if len(digests) > 1:  # publish takes any one of them as the report it gates on
        record["validations_sha256"] = digests
    text += "\n" + RECORD_PREFIX + json.dumps(record, sort_keys=True) + " -->\n"
    if tune_dir:
        for name in PLOTS:
            if (tune_dir / name).is_file():
                shutil.copyfile(tune_dir / name, folder / name)
                os.chmod(folder / name, 0o644)
    target = folder / CARD_FILE
    write_text_atomic(target, text)
    return target


def read_validations(
    paths: Sequence[Path], files: dict[str, str], folder: Path
) -> list[ValidationReport]:
    """Each report, bound to exactly ``files``, one per prompt set; InputError naming the
    file otherwise."""
    reports: list[ValidationReport] = []
    seen: dict[str, Path] = {}  # the prompts' digest: the report that validated them
    for path in paths:
        report = read_report(path)
        check_report_binding(path, report, files, folder)
        if report.prompts_sha256 in seen:
            raise InputError(
                f"{path}: validated the same prompts as {seen[report.prompts_sha256]}; "
                "give one report per prompt set"
            )
        seen[report.prompts_sha256] = path
        reports.append(report)
    return reports


def check_report_binding(
    path: Path, report: ValidationReport, files: dict[str, str], folder: Path
) -> None:
    """The validation report validated exactly ``files``; InputError naming the file otherwise."""
    draft = report.files.get("draft")
    recorded = draft.files if draft else None
    if recorded is None:
        raise InputError(
            f"{path}: records no sha256 of the files it validated; rerun eaglequant validate "
            f"on {folder}"
        )
    differs = first_difference(recorded, files)
    if differs is not None:
        raise InputError(
            f"{path}: made for other bytes: {differs} differs from {folder / differs}; "
            f"rerun eaglequant validate on {folder}"
        )


def card_record(text: str) -> dict[str, Any] | None:
    """What a card says it was rendered from (``files_sha256``, ``validation_sha256``)."""
    found = RECORD.findall(text)
    if not found:
        return None
    try:
        data = json.loads(found[-1])
    except json.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


def source_license(source: Path) -> str | None:
    """The ``license`` in the source draft's model card front matter, when there is one."""
    readme = source / "README.md"
    if not readme.is_file():
        return None
    parts = readme.read_text(encoding="utf-8", errors="replace").split("---\n")
    if len(parts) < 3 or parts[0].strip():
        return None
    try:
        meta = yaml.safe_load(parts[1])
    except yaml.YAMLError:
        return None
    value = meta.get("license") if isinstance(meta, dict) else None
    return str(value) if value else None


def front_matter(base_model: str, license_id: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "base_model": base_model,
        "base_model_relation": "quantized",
        "library_name": "vllm",
        "tags": ["eagle3", "speculative-decoding", "fp8", "quark", "draft-model"],
    }
    if license_id:
        meta["license"] = license_id
    return meta


def render(
    folder: Path,
    names: PublicNames,
    config: DraftConfig,
    manifest: Manifest,
    validations: Sequence[ValidationReport],
    results: Mapping[str, Any] | None,
    license_id: str | None,
    comparison: CompareReport | None = None,
) -> str:
    """The card's Markdown, naming no path of this machine (InputError if one would remain)."""
    recorded = tune_summary(results) if results else None
    qcfg = config["quantization_config"]
    local = local_paths(folder, manifest, None, recorded)
    reports = []
    for validation in validations:
        data = validation.to_json()
        own = local_paths(folder, manifest, data, recorded)
        local = sorted(set(local) | set(own), key=len, reverse=True)
        reports.append(ValidationReport.from_json(public(data, names, own)))
    report = reports[0] if reports else None
    tuning = tune_summary(public(recorded, names, local)) if recorded else None
    speculative, note = _usage(names.repo_id, report, tuning)
    title = names.repo_id.split("/")[-1] if names.repo_id != NO_REPO_ID else "FP8 EAGLE-3 draft"
    parts = [
        "---\n"
        + yaml.safe_dump(front_matter(names.base_model, license_id), sort_keys=False)
        + "---\n",
        f"# {title}\n",
        f"FP8 E4M3 EAGLE-3 draft model for `{names.base_model}`, quantized with AMD Quark "
        f"{qcfg.get('version', '')} by eaglequant {manifest.get('version', '')} "
        f"(recipe `{manifest['recipe']['name']}`).\n",
        "## Usage\n",
        "```\nvllm serve "
        + names.base_model
        + " \\\n  --speculative-config '"
        + json.dumps(speculative)
        + "'\n```\n"
        + note
        + (
            f"\n`{NO_REPO_ID}`: the Hub id this folder is published under.\n"
            if names.repo_id == NO_REPO_ID
            else ""
        ),
        _quantization_section(config, manifest),
        _calibration_section(manifest),
    ]
    if reports:
        parts.append(validated_temperatures(reports))
    if len(reports) > 1:
        parts.append(validation_sets_markdown(reports))
        parts += [validation_markdown(r, heading="###", title=set_title(r)) for r in reports]
    elif report:
        parts.append(validation_markdown(report))
    if comparison:
        parts.append(compare_markdown(comparison))
    if tuning:
        parts.append("## Tuning (`eaglequant tune`)\n\n" + tune_markdown(tuning))
        parts.append("".join(f"![{n}]({n})\n" for n in PLOTS))
    parts.append(_environment_section(report, tuning))
    parts.append(_reproduce_section(names, manifest, report, tuning))
    parts.append(_files_section(folder, manifest))
    text = "\n".join(parts)
    leaks = [p for p in local if p in text] + machine_paths(text)
    if leaks:
        raise InputError(
            f"{folder}: the card would name the machine path {leaks[0]!r}; it comes from the "
            "reports or the manifest: rerun the command that wrote it with relative paths"
        )
    return text


def _usage(
    name: str, report: ValidationReport | None, tuning: TuneSummary | None
) -> tuple[SpeculativeDict, str]:
    """The usage line's speculative config (tune's recommendation where there is one), a note."""
    validated_k = (report.k if report else None) or 6
    if tuning is None:
        return speculative_config(name, validated_k), ""
    chosen, best_single = tuning["recommendation"]["k"], None
    if tuning["kind"] == SWEEP:
        if tuning["recommendation"]["schedule"]:
            note = "\nk by batch size, from the measured schedule in *Tuning* below.\n"
            return schedule_config(name, tuning["schedule"]["ranges"]), note
        best_single = tuning["best_single_k"]
    k = chosen or best_single or validated_k
    if not chosen and tuning["kind"] == COMPARISON:
        note = (
            f"\nOn the setup measured in *Tuning* below this draft was not chosen at any "
            f"concurrency ({tuning['recommendation'].get('text', '')}); k={k} is shown for "
            "setups where it is.\n"
        )
        return speculative_config(name, k), note
    if not chosen:
        note = (
            f"\nOn the setup measured in *Tuning* below no k was faster than serving without "
            f"speculation; k={k}, the best single k there, is shown for setups where it is.\n"
        )
        return speculative_config(name, k), note
    return speculative_config(name, k), ""


def validated_temperatures(reports: Sequence[ValidationReport]) -> str:
    """The sampling temperatures the acceptance checks were validated at, with their prompt
    sets (check 1, lossless, is judged greedy in every report)."""
    at: dict[float, list[str]] = {}
    for report in reports:
        source = report.prompt_set["source"] if report.prompt_set else "the validation prompts"
        at.setdefault(report.temperature, []).append(f"`{source}`")
    sets = "; ".join(
        f"{'0 (greedy)' if t == 0 else f'{t:g} (sampled)'} on {', '.join(names)}"
        for t, names in sorted(at.items())
    )
    return (
        f"Acceptance (checks 2 and 5) validated at temperature {sets}; lossless output "
        "(check 1) is checked greedy.\n"
    )


def _quantization_section(config: DraftConfig, manifest: Manifest) -> str:
    fates = predict_fates(config)
    rows = "\n".join(
        f"| `{', '.join(f.checkpoint_names)}` | "
        f"{f'{f.scheme} (`{f.vllm_scheme}`)' if f.quantized else f'BF16 ({f.reason})'} |"
        for f in fates
    )
    exclude = config["quantization_config"].get("exclude") or []
    return (
        "## What is quantized\n\n| layers | format in vLLM |\n|---|---|\n" + rows + "\n\n"
        f"`exclude` is written as regex ({', '.join(f'`{e}`' for e in exclude)}): vLLM matches "
        "exclusions against its own module names (`model.fc`, `model.layers.N…`), so bare "
        "names would leave `fc` quantized. Embeddings and norms are not quantized.\n"
    )


def _calibration_section(manifest: Manifest) -> str:
    calib = manifest["calibration"]
    rows = "\n".join(
        f"| `{layer['name']}` | {layer['weight_scale']:.4g} | "
        f"{_fmt(layer['input_scale'], '.4g')} | {_fmt(layer['sqnr_db'], '.1f', '-')} |"
        for layer in manifest["layers"]
    )
    agreement = ", ".join(f"{a:.3f}" for a in manifest.get("top1_agreement_by_step") or [])
    return (
        "## Calibration\n\n"
        f"Source: {calibration_source(calib)}; {calib['tokens']} tokens over "
        f"{calib['speculative_steps']} "
        f"speculative steps; calibrated: {'yes' if calib['calibrated'] else 'NO (fixed range)'}."
        "\n\n"
        "| layer | weight scale | input scale | output SQNR (dB) |\n|---|---|---|---|\n"
        + rows
        + "\n"
        + (f"\nTop-1 agreement with the BF16 draft by step: {agreement}.\n" if agreement else "")
    )


def _fmt(value: float | None, spec: str, missing: str = "dynamic") -> str:
    return missing if value is None else format(value, spec)


def calibration_source(calib: CalibrationRecord) -> str:
    """Where the calibration inputs came from, described without locating them."""
    engine = ((calib.get("capture") or {}).get("engine") or {}).get("name")
    on = f" ({engine})" if engine else ""
    sequences = f", {calib['sequences']} sequences" if calib.get("sequences") else ""
    kind = calib.get("kind")
    if kind == "capture":
        return f"the target's hidden states captured with `eaglequant capture`{on}{sequences}"
    if kind == "target":
        return f"the target's hidden states on the calibration data{on}{sequences}"
    if kind == "none":
        return "none (fixed input range from the recipe; scales NOT calibrated)"
    return str(kind)


def _environment_section(report: ValidationReport | None, tuning: TuneSummary | None) -> str:
    """Versions and hardware: those the reports recorded, else this machine's (and which)."""
    recorded = tuning.get("environment") if tuning else None
    if report and report.environment:
        block, origin = (
            report.environment,
            "recorded by `eaglequant validate` with the run above",
        )
    elif recorded:
        block, origin = recorded, "recorded by `eaglequant tune` with the run above"
    else:
        block = environment()
        origin = "of the machine that rendered this card (no report recorded one)"
    return f"## Environment\n\nThe software and hardware {origin}:\n\n" + environment_markdown(
        block
    )


PLACEHOLDER_MEANINGS = {
    "<BF16_DRAFT>": "the BF16 EAGLE-3 draft this model was exported from",
    "<FP8_DRAFT>": "this repository's files",
    "<CALIB_DATA>": "the calibration data (JSONL)",
    "<CAPTURE>": "a folder written by `eaglequant capture`",
    "<PROMPTS>": "the validation or benchmark prompts",
    "<REPORT_JSON>": "the JSON report written",
    "<REPORT_MD>": "the Markdown report written",
    "<TUNE_OUT>": "tune's output folder",
    "<PATH>": "a local path",
}


def _reproduce_section(
    names: PublicNames,
    manifest: Manifest,
    report: ValidationReport | None,
    tuning: TuneSummary | None,
) -> str:
    """The export, validate and tune command lines as they were run, paths as placeholders."""
    runs = [("export", manifest.get("command"))]
    if report is not None:
        runs.append(("validate", report.command))
    if tuning is not None:
        runs.append(("tune", tuning.get("command")))
    lines = [c if c else f"# {name}: the command line was not recorded" for name, c in runs]
    text = "\n".join(ABSOLUTE_PATH.sub("<PATH>", line) for line in lines)
    meanings = {"<TARGET>": f"the target model (`{names.base_model}`)", **PLACEHOLDER_MEANINGS}
    used = [f"`{p}`: {m}" for p, m in meanings.items() if p in text]
    return (
        "## Reproduce\n\nThe commands as they were run"
        + (" (" + "; ".join(used) + ")" if used else "")
        + ":\n\n```\n"
        + text
        + "\n```\n"
    )


def _files_section(folder: Path, manifest: Manifest) -> str:
    rows = "\n".join(
        f"| `{name}` | {_size(folder / name)} | `{digest}` |"
        for name, digest in manifest["files"].items()
    )
    return "## Files (sha256)\n\n| file | bytes | sha256 |\n|---|---|---|\n" + rows + "\n"


def _size(path: Path) -> str:
    return str(path.stat().st_size) if path.is_file() else "-"
