"""``eaglequant card``: the Hugging Face model card of an exported FP8 draft, from measured data.

Reads the folder's config and ``eaglequant.json`` manifest, optionally a
validation report (``validate --json``) and a tuning folder (``tune --out``),
and writes ``README.md`` with YAML front matter into the folder (atomically),
copying the tuning plots beside it, so the folder is ready for ``hf upload``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import yaml

from eaglequant.errors import InputError
from eaglequant.exclusions import predict_fates
from eaglequant.io.checkpoint import read_checkpoint
from eaglequant.manifest import read_json_object, read_manifest
from eaglequant.render.reports import (
    COMPARE_JSON,
    PLOTS,
    compare_markdown,
    tune_markdown,
    validation_markdown,
)
from eaglequant.serving import schedule_config, speculative_config


def write_card(
    folder: Path,
    base_model: str,
    validation: Path | None = None,
    tune_dir: Path | None = None,
    license_id: str | None = None,
    compare_dir: Path | None = None,
) -> Path:
    config = read_checkpoint(folder).config  # as vLLM reads it, in any draft format
    if "quantization_config" not in config:
        raise InputError(f"{folder}: no quantization_config; run the card on an exported FP8 draft")
    manifest = read_manifest(folder)
    report = read_json_object(validation, "validation report") if validation else None
    tuning = read_json_object(tune_dir / "results.json", "tuning results") if tune_dir else None
    license_id = license_id or source_license(Path(manifest.get("source", "")))
    comparison = None
    if compare_dir:
        comparison = read_json_object(compare_dir / COMPARE_JSON, "comparison")
    text = render(
        folder, base_model, config, manifest, report, tuning, license_id, comparison=comparison
    )
    if tune_dir:
        for name in PLOTS:
            if (tune_dir / name).is_file():
                shutil.copyfile(tune_dir / name, folder / name)
                os.chmod(folder / name, 0o644)
    target = folder / "README.md"
    fd, temp = tempfile.mkstemp(prefix=".README.md.", dir=folder)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(temp, 0o644)
    os.replace(temp, target)
    return target


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
    base_model: str,
    config: dict[str, Any],
    manifest: dict[str, Any],
    report: dict[str, Any] | None,
    tuning: dict[str, Any] | None,
    license_id: str | None,
    comparison: dict[str, Any] | None = None,
) -> str:
    qcfg = config["quantization_config"]
    speculative, note = _usage(folder.name, report, tuning)
    parts = [
        "---\n" + yaml.safe_dump(front_matter(base_model, license_id), sort_keys=False) + "---\n",
        f"# {folder.name}\n",
        f"FP8 E4M3 EAGLE-3 draft model for `{base_model}`, quantized with AMD Quark "
        f"{qcfg.get('version', '')} by eaglequant {manifest.get('version', '')} "
        f"(recipe `{manifest['recipe']['name']}`).\n",
        "## Usage\n",
        "```\nvllm serve "
        + base_model
        + " \\\n  --speculative-config '"
        + json.dumps(speculative)
        + "'\n```\n"
        + note,
        _quantization_section(config, manifest),
        _calibration_section(manifest),
    ]
    if report:
        parts.append(validation_markdown(report))
    if comparison:
        parts.append(compare_markdown(comparison))
    if tuning:
        parts.append("## Tuning (`eaglequant tune`)\n\n" + tune_markdown(tuning))
        parts.append("".join(f"![{n}]({n})\n" for n in PLOTS))
    parts.append(_files_section(manifest))
    return "\n".join(parts)


def _usage(
    name: str, report: dict[str, Any] | None, tuning: dict[str, Any] | None
) -> tuple[dict[str, Any], str]:
    """The usage line's speculative config (tune's recommendation where there is one), a note."""
    tuned = tuning or {}
    choice = tuned.get("recommendation") or {}
    if choice.get("schedule"):
        note = "\nk by batch size, from the measured schedule in *Tuning* below.\n"
        return schedule_config(name, tuned["schedule"]["ranges"]), note
    k = choice.get("k") or tuned.get("best_single_k") or (report or {}).get("k") or 6
    if choice and not choice["k"]:
        note = (
            f"\nOn the setup measured in *Tuning* below no k was faster than serving without "
            f"speculation; k={k}, the best single k there, is shown for setups where it is.\n"
        )
        return speculative_config(name, k), note
    return speculative_config(name, k), ""


def _quantization_section(config: dict[str, Any], manifest: dict[str, Any]) -> str:
    fates = predict_fates(config)
    rows = "\n".join(
        f"| `{', '.join(f.checkpoint_names)}` | "
        f"{f'{f.scheme} (`{f.vllm_scheme}`)' if f.quantized else f'BF16 ({f.reason})'} |"
        for f in fates
    )
    exclude = config["quantization_config"].get("exclude")
    return (
        "## What is quantized\n\n| layers | format in vLLM |\n|---|---|\n" + rows + "\n\n"
        f"`exclude` is written as regex ({', '.join(f'`{e}`' for e in exclude)}): vLLM matches "
        "exclusions against its own module names (`model.fc`, `model.layers.N…`), so bare "
        "names would leave `fc` quantized. Embeddings and norms are not quantized.\n"
    )


def _calibration_section(manifest: dict[str, Any]) -> str:
    calib = manifest["calibration"]
    rows = "\n".join(
        f"| `{layer['name']}` | {layer['weight_scale']:.4g} | "
        f"{_fmt(layer['input_scale'], '.4g')} | {_fmt(layer['sqnr_db'], '.1f', '-')} |"
        for layer in manifest["layers"]
    )
    agreement = ", ".join(f"{a:.3f}" for a in manifest.get("top1_agreement_by_step") or [])
    return (
        "## Calibration\n\n"
        f"Source: {calib['source']}; {calib['tokens']} tokens over {calib['speculative_steps']} "
        f"speculative steps; calibrated: {'yes' if calib['calibrated'] else 'NO (fixed range)'}."
        "\n\n"
        "| layer | weight scale | input scale | output SQNR (dB) |\n|---|---|---|---|\n"
        + rows
        + "\n"
        + (f"\nTop-1 agreement with the BF16 draft by step: {agreement}.\n" if agreement else "")
    )


def _fmt(value: float | None, spec: str, missing: str = "dynamic") -> str:
    return missing if value is None else format(value, spec)


def _files_section(manifest: dict[str, Any]) -> str:
    rows = "\n".join(f"| `{name}` | `{digest}` |" for name, digest in manifest["files"].items())
    return "## Files (sha256)\n\n| file | sha256 |\n|---|---|\n" + rows + "\n"
