"""An exported-looking FP8 draft folder and its validation report, without Quark or vLLM.

For the card and publish tests: a tiny sharded draft with a Quark
``quantization_config``, the manifest export writes (real ``build_manifest``,
digests of the real bytes), and a validation report as validate writes it
(real ``ValidationReport``, bound by the real ``binding``). Every path is under
distinctive local folder names, absolute, so a test can scan what is published
for any of them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from eaglequant.io.readback import sha256_file
from eaglequant.recipe import load_recipe
from eaglequant.results.binding import binding, folder_files
from eaglequant.results.environment import environment
from eaglequant.results.manifest import MANIFEST_FILE, build_manifest, write_manifest
from eaglequant.results.provenance import command_string
from eaglequant.results.spec_counts import AcceptanceRecord
from eaglequant.results.validation_report import (
    Check,
    CheckId,
    EngineSummary,
    ValidationReport,
    prompts_digest,
)
from eaglequant_examples.synthetic import draft_config, write_random_draft

# Names that exist only on this machine: none may reach the card or the Hub.
WORK = "machine-local-work"
LOCAL_NAMES = (WORK, "bf16-src-local", "fp8-out-local", "target-local", "calib-local.jsonl")
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class Exported:
    folder: Path
    source: Path
    target: Path
    validation: Path

    def shards(self) -> list[str]:
        return sorted(p.name for p in self.folder.glob("*.safetensors"))


def make_exported(tmp_path: Path, *, passed: bool = True) -> Exported:
    work = tmp_path / WORK
    source = write_random_draft(work / "bf16-src-local", draft_config(), seed=0)
    folder = write_random_draft(
        work / "fp8-out-local", draft_config(), seed=1, max_shard_size=40_000
    )
    _add_quark_config(folder)
    target = work / "target-local"
    target.mkdir()
    data = work / "calib-local.jsonl"
    data.write_text('{"text": "hello"}\n')
    export_argv = ["export", str(source), str(folder), "--calib-target", str(target)]
    export_argv += ["--calib-data", str(data), "--calib-engine", "transformers"]
    paths = {
        source: "<BF16_DRAFT>",
        folder: "<FP8_DRAFT>",
        target: "<TARGET>",
        data: "<CALIB_DATA>",
    }
    write_manifest(
        folder,
        build_manifest(
            source=source,
            recipe=load_recipe().to_dict(),
            calibration={
                "source": f"target {target} on {data} (transformers)",
                "kind": "target",
                "calibrated": True,
                "sequences": 8,
                "tokens": 2048,
                "held_out_tokens": 256,
                "speculative_steps": 3,
                "aux_layer_ids": [1, 2, 3],
                "capture": {"target": str(target), "data": str(data), "engine": {"name": "hf"}},
            },
            layers=[
                {
                    "name": f"midlayer.{n}",
                    "weight_scale": 0.0004,
                    "input_scale": 0.0137,
                    "sqnr_db": 33.3,
                }
                for n in LINEARS
            ],
            top1_agreement=[0.978, 0.963, 0.946],
            timings={"total": 1.0},
            files=folder_files(folder),
            device={"kind": "cpu"},
            command=command_string(export_argv, paths),
        ),
    )
    validation = folder / "validation.json"
    validation.write_text(json.dumps(validation_report(folder, source, target, passed)) + "\n")
    return Exported(folder, source, target, validation)


def validation_report(folder: Path, source: Path, target: Path, passed: bool) -> dict:
    """A report as ``validate --json`` writes it, for ``folder`` against ``source``."""
    spec = json.dumps({"model": str(folder), "method": "eagle3", "num_speculative_tokens": 3})
    engine_config = {
        "llm": {"enforce_eager": True, "model": str(target)},
        "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_DIST_IDENT": "a81c2f", "TMPDIR": str(folder)},
        "vllm": "0.32.0",
    }
    fp8 = AcceptanceRecord(
        mean_length=3.19, per_position=(0.862, 0.693, 0.635), drafts=100, accepted=219
    )
    engines = {
        "target": EngineSummary(ok=True, returncode=0, timed_out=False, wall_s=40.0),
        "bf16": EngineSummary(
            ok=True,
            returncode=0,
            timed_out=False,
            wall_s=41.0,
            acceptance=replace(fp8, mean_length=3.214, accepted=221),
        ),
        "fp8": EngineSummary(
            ok=True,
            returncode=0,
            timed_out=False,
            wall_s=42.0,
            acceptance=fp8,
            engine_config=engine_config,
        ),
    }
    names = (CheckId.LOSSLESS, CheckId.ACCEPTANCE, CheckId.LAYERS, CheckId.ENGINE_LOG)
    checks = [Check(n, True, f"{n} detail for {folder}") for n in (*names, CheckId.PER_POSITION)]
    checks.append(Check(CheckId.SCALES, passed, "every scale within 4.0x"))
    argv = ["validate", "--target", str(target), "--draft", str(folder), "--baseline", str(source)]
    paths = {target: "<TARGET>", folder: "<FP8_DRAFT>", source: "<BF16_DRAFT>"}
    report = ValidationReport(
        target=str(target),
        draft=str(folder),
        baseline=str(source),
        k=3,
        prompts=32,
        max_tokens=48,
        backend="cpu",
        plugin_active=True,
        engines=engines,
        checks=checks,
        serve_command=f"vllm serve {target} --speculative-config '{spec}'",
        prompts_sha256=prompts_digest([f"prompt {i}" for i in range(32)]),
        files={"draft": binding(folder), "baseline": binding(source)},
        command=command_string([*argv, "--prompts", "p.jsonl"], paths),
        environment=environment(gpus=False),
    )
    return report.to_json()


def _add_quark_config(folder: Path) -> None:
    spec = {"dtype": "fp8_e4m3", "qscheme": "per_tensor", "is_dynamic": False}
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    config["quantization_config"] = {
        "quant_method": "quark",
        "version": "0.13",
        "exclude": ["re:.*fc.*", "re:.*lm_head.*"],
        "global_quant_config": {"weight": spec, "input_tensors": spec, "output_tensors": None},
        "layer_quant_config": {},
        "export": {"kv_cache_group": []},
    }
    config_path.write_text(json.dumps(config, indent=2))


def flip_byte(path: Path, offset: int = -1) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def rerecord(folder: Path) -> None:
    """Record the folder's current bytes in its manifest, as an export that wrote them would
    (for tests that edit an exported folder on purpose and then validate it)."""
    path = folder / MANIFEST_FILE
    manifest = json.loads(path.read_text())
    manifest["files"] = {name: sha256_file(folder / name) for name in manifest["files"]}
    path.write_text(json.dumps(manifest, indent=2) + "\n")
