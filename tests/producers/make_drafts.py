"""Regenerate the FP8 drafts that other producers' real tools write, and their broken variants.

Runs in a throwaway virtual environment that holds the producers' pinned tools (never an
eaglequant dependency; see README.md beside this file):

    python tests/producers/make_drafts.py --pair toy
    python tests/producers/make_drafts.py --pair smollm2 --out DIR

``--pair toy`` quantizes the toy pair's BF16 draft (``examples/toy/draft``) and writes the
committed fixtures under ``tests/producers/toy/``. ``--pair smollm2`` quantizes the real
pair's committed draft (``examples/smollm2/draft``); those drafts are about 23 MB each and
are not committed, so ``--out`` is required.

Each fixture is a draft folder as the tool wrote it, or derived from one by a single named
change. ``manifest.json`` in the output folder records, per fixture, the tool and version,
the exact command or change, what its config declares, its files' sha256, and known defects.
The tools read their input and write only into a temporary folder, which replaces the
fixture's folder when complete.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
VENDORED = HERE / "vendor" / "quantize_drafter.py"
VENDORED_SHA256 = "c55333a46b55ae252e334b96ec3bb2d35d80b0fd4970e2789ad2fa838f805c0e"
PINS = {
    "torch": "2.13.0",
    "nvidia-modelopt": "0.47.0",
    "llmcompressor": "0.14.0.1",
    "compressed-tensors": "0.19.0",
    "transformers": "5.17.0",
    "safetensors": "0.8.0",
}
PAIRS = {"toy": REPO / "examples/toy/draft", "smollm2": REPO / "examples/smollm2/draft"}
# What llm-compressor's documentation passes to model_free_ptq, with the draft's names:
# `lm_head` and embeddings stay BF16; `fc` (vLLM's `model.fc`) must be matched by a regex.
GOOD_IGNORE = ["lm_head", "re:.*fc.*", "re:.*embed_tokens.*"]
PLAIN_IGNORE = ["lm_head", "fc", "embed_tokens"]
# The checkpoint's name for the draft's attention output projection. vLLM builds it as
# `model.layers.<target layers>.self_attn.o_proj`, so neither this name nor ModelOpt's
# fnmatch copy of it ("*midlayer.self_attn.o_proj") matches there.
O_PROJ = "midlayer.self_attn.o_proj"
# The layer the broken variants break: an MLP projection in every draft.
BROKEN_LAYER = "midlayer.mlp.down_proj"
CLIP_DIVISOR = 1000.0
NON_CONTIGUOUS = "You are trying to save a non contiguous tensor"
CONTIGUOUS_SAVE = (
    "import llmcompressor.entrypoints.model_free as mf; from safetensors.torch import save_file; "
    "mf.save_file = lambda t, p, **k: save_file({n: v.contiguous() for n, v in t.items()}, p, **k)"
)
NOTES: dict[str, dict[str, str]] = {}  # fixture name -> what the tool could not do, and the fix


class Refused(Exception):
    """A precondition failed; the message names what and how to fix it."""


@dataclass(frozen=True, kw_only=True)
class Fixture:
    name: str
    tool: str
    command: str
    purpose: str
    derived_from: str | None = None
    defects: list[str] = field(default_factory=list)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", choices=sorted(PAIRS), required=True)
    parser.add_argument("--out", type=Path, help="output folder (default for toy: toy/ here)")
    args = parser.parse_args(argv)
    try:
        out = _output_folder(args.pair, args.out)
        _check_environment()
        manifest = make_all(PAIRS[args.pair], out, args.pair)
    except Refused as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {len(manifest['fixtures'])} drafts and manifest.json under {out}")
    return 0


def _output_folder(pair: str, out: Path | None) -> Path:
    if out is None:
        if pair != "toy":
            raise Refused(f"--pair {pair}: pass --out DIR (real-pair drafts are not committed)")
        return HERE / "toy"
    return out.resolve()


def _check_environment() -> None:
    for package, version in PINS.items():
        try:
            found = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found = "absent"
        if found.split("+")[0] != version:
            raise Refused(
                f"{package} is {found}, these fixtures are pinned to {version}: "
                f"run with the producers' venv (README.md beside {Path(__file__).name})"
            )
    digest = _sha256(VENDORED)
    if digest != VENDORED_SHA256:
        raise Refused(f"{VENDORED} has sha256 {digest}, expected {VENDORED_SHA256}: restore it")


def make_all(source: Path, out: Path, pair: str) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    made: dict[str, dict] = {}
    for fixture, build in _plan(source, out):
        with tempfile.TemporaryDirectory(dir=out, prefix=".making-") as work:
            folder = Path(work) / fixture.name
            build(folder)
            _replace(folder, out / fixture.name)
        made[fixture.name] = _describe(fixture, out / fixture.name, source, pair)
        print(f"{fixture.name}: {made[fixture.name]['declared']['quant_method']}", flush=True)
    manifest = {
        "schema_version": 1,
        "pair": pair,
        "source": str(source.relative_to(REPO)),
        "source_sha256": _folder_digests(source),
        "tools": {name: importlib.metadata.version(name) for name in PINS},
        "vendored": {"path": str(VENDORED.relative_to(REPO)), "sha256": VENDORED_SHA256},
        "fixtures": made,
    }
    _write_json(out / "manifest.json", manifest)
    return manifest


def _plan(source: Path, out: Path) -> list[tuple[Fixture, Callable[[Path], None]]]:
    """Every fixture and how it is made, in order: derived ones after their bases."""
    quantize_drafter = "python tests/producers/vendor/quantize_drafter.py"
    src = "--drafter_path DRAFT --qformat fp8 --export_path OUT"
    repaired = "modelopt-fp8-d2t-repaired"
    dynamic = "ct-fp8-dynamic"
    plan: list[tuple[Fixture, Callable[[Path], None]]] = [
        (
            Fixture(
                name="modelopt-fp8",
                tool="nvidia-modelopt",
                command=f"{quantize_drafter} {src}",
                purpose="ModelOpt FP8 as quantize_drafter.py writes it",
                defects=["d2t and t2d cast to bfloat16 (see d2t_changed)"],
            ),
            lambda o: _quantize_drafter(source, o, []),
        ),
        (
            Fixture(
                name=repaired,
                tool="nvidia-modelopt",
                command="d2t and t2d of modelopt-fp8 replaced by the BF16 draft's (int64, bool)",
                purpose="good: ModelOpt FP8 with its d2t repaired",
                derived_from="modelopt-fp8",
            ),
            lambda o: _derive(out / "modelopt-fp8", o, _restore_maps(source)),
        ),
        (
            Fixture(
                name="modelopt-fp8-exclude-o-proj",
                tool="nvidia-modelopt",
                command=f"{quantize_drafter} {src} --exclude '*self_attn.o_proj*'"
                " (then d2t and t2d replaced by the BF16 draft's)",
                purpose="broken: exclude_modules names o_proj by its checkpoint name, which vLLM"
                " does not match; vLLM builds it FP8 and loads the BF16 weight",
                defects=[f"{O_PROJ} stored BF16 without scales, not excluded for vLLM"],
            ),
            lambda o: _quantize_drafter(
                source, o, ["--exclude", "*self_attn.o_proj*"], repair_maps=True
            ),
        ),
        (
            Fixture(
                name="modelopt-fp8-missing-input-scale",
                tool="nvidia-modelopt",
                command=f"{BROKEN_LAYER}.input_scale deleted",
                purpose="broken: a missing input scale",
                derived_from=repaired,
                defects=[f"{BROKEN_LAYER}.input_scale absent"],
            ),
            lambda o: _derive(out / repaired, o, _drop(f"{BROKEN_LAYER}.input_scale")),
        ),
        (
            Fixture(
                name="modelopt-fp8-zero-weight-scale",
                tool="nvidia-modelopt",
                command=f"{BROKEN_LAYER}.weight_scale set to 0",
                purpose="broken: a zero weight scale",
                derived_from=repaired,
                defects=[f"{BROKEN_LAYER}.weight_scale is 0"],
            ),
            lambda o: _derive(out / repaired, o, _zero(f"{BROKEN_LAYER}.weight_scale")),
        ),
        (
            Fixture(
                name="modelopt-fp8-clipped-input-scale",
                tool="nvidia-modelopt",
                command=f"every input_scale divided by {CLIP_DIVISOR:g} (1.0 -> 0.001)",
                purpose="broken: static input scales that clip (FP8 range +-0.448)",
                derived_from=repaired,
                defects=["every input_scale 0.001"],
            ),
            lambda o: _derive(out / repaired, o, _divide_input_scales),
        ),
    ]
    for name, scheme, ignore, purpose, defects in (
        (dynamic, "FP8_DYNAMIC", GOOD_IGNORE, "good: llm-compressor FP8_DYNAMIC", []),
        (
            "ct-fp8-dynamic-plain-ignore",
            "FP8_DYNAMIC",
            PLAIN_IGNORE,
            "broken: ignore 'fc' keeps fc BF16 in the file, but vLLM's layer is model.fc,"
            " which 'fc' does not match; vLLM builds it FP8 and loads the BF16 weight",
            ["fc stored BF16 without scales, not ignored for vLLM"],
        ),
        (
            "ct-fp8-dynamic-ignore-o-proj",
            "FP8_DYNAMIC",
            [*GOOD_IGNORE, O_PROJ],
            "broken: ignore names o_proj by its checkpoint name, which vLLM does not match",
            [f"{O_PROJ} stored BF16 without scales, not ignored for vLLM"],
        ),
        (
            "ct-fp8-block",
            "FP8_BLOCK",
            GOOD_IGNORE,
            "llm-compressor FP8_BLOCK (128x128 weight blocks, dynamic per-group-128 inputs)",
            [],
        ),
    ):
        plan.append(
            (
                Fixture(
                    name=name,
                    tool="llmcompressor",
                    command=(
                        "from llmcompressor import model_free_ptq; model_free_ptq("
                        f"model_stub=DRAFT, save_directory=OUT, scheme={scheme!r}, "
                        f"ignore={ignore!r}, max_workers=1, device='cpu')"
                    ),
                    purpose=purpose,
                    defects=defects,
                ),
                lambda o, s=scheme, i=ignore: _model_free_ptq(source, o, s, i),
            )
        )
    plan += [
        (
            Fixture(
                name="ct-fp8-dynamic-missing-weight-scale",
                tool="llmcompressor",
                command=f"{BROKEN_LAYER}.weight_scale deleted",
                purpose="broken: a missing weight scale",
                derived_from=dynamic,
                defects=[f"{BROKEN_LAYER}.weight_scale absent"],
            ),
            lambda o: _derive(out / dynamic, o, _drop(f"{BROKEN_LAYER}.weight_scale")),
        ),
        (
            Fixture(
                name="ct-fp8-dynamic-zero-weight-scale",
                tool="llmcompressor",
                command=f"{BROKEN_LAYER}.weight_scale set to 0 (every channel)",
                purpose="broken: a zero weight scale",
                derived_from=dynamic,
                defects=[f"{BROKEN_LAYER}.weight_scale is 0"],
            ),
            lambda o: _derive(out / dynamic, o, _zero(f"{BROKEN_LAYER}.weight_scale")),
        ),
    ]
    return plan


# --- the tools ----------------------------------------------------------------------------


def _quantize_drafter(
    source: Path, out: Path, extra: list[str], *, repair_maps: bool = False
) -> None:
    """NVIDIA's script as its docstring runs it, in a child process."""
    command = [
        sys.executable,
        str(VENDORED),
        "--drafter_path",
        str(source),
        "--qformat",
        "fp8",
        "--export_path",
        str(out),
        *extra,
    ]
    _run(command)
    if repair_maps:
        _edit_tensors(out, _restore_maps(source))


def _model_free_ptq(source: Path, out: Path, scheme: str, ignore: list[str]) -> None:
    """llm-compressor's model-free PTQ as its examples call it, in a child process.

    Where llmcompressor 0.14.0.1 computes the weights but cannot save them (FP8_BLOCK on
    widths 128 does not divide leaves the FP8 weight a non-contiguous view of its padded
    blocks, which safetensors refuses), the run is repeated with its ``save_file`` given
    contiguous copies of the same tensors, and the manifest records the failure.
    """
    call = (
        "model_free_ptq(model_stub=sys.argv[1], save_directory=sys.argv[2], "
        f"scheme={scheme!r}, ignore={ignore!r}, max_workers=1, device='cpu')"
    )
    code = f"import sys; from llmcompressor import model_free_ptq; {call}"
    try:
        _run([sys.executable, "-c", code, str(source), str(out)])
        return
    except Refused as error:
        if NON_CONTIGUOUS not in str(error):
            raise
        failure = next(line for line in str(error).splitlines() if NON_CONTIGUOUS in line)
    shutil.rmtree(out, ignore_errors=True)
    _run([sys.executable, "-c", f"{CONTIGUOUS_SAVE}; {code}", str(source), str(out)])
    NOTES[out.name] = {
        "tool_failure": failure.split(" which is not allowed")[0],
        "workaround": f"saved contiguous: {CONTIGUOUS_SAVE}",
    }


def _run(command: list[str]) -> None:
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-20:])
        raise Refused(f"`{shlex.join(command)}` exited {result.returncode}:\n{tail}")


# --- derived variants ---------------------------------------------------------------------

Edit = Callable[[dict], None]


def _derive(base: Path, out: Path, edit: Edit) -> None:
    if not (base / "config.json").is_file():
        raise Refused(f"{base}: not made yet (derived variants follow their base)")
    shutil.copytree(base, out)
    _edit_tensors(out, edit)


def _edit_tensors(folder: Path, edit: Edit) -> None:
    """Apply ``edit`` to the folder's single safetensors file, keeping its metadata."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    path = folder / "model.safetensors"
    with safe_open(path, "pt") as handle:
        metadata = handle.metadata()
    tensors = load_file(path)
    edit(tensors)
    path.unlink()
    save_file(tensors, path, metadata=metadata)
    index = folder / "model.safetensors.index.json"
    if index.is_file():  # llm-compressor writes one; keep its weight map true to the file
        data = json.loads(index.read_text())
        data["weight_map"] = {name: path.name for name in sorted(tensors)}
        data["metadata"]["total_size"] = sum(t.nbytes for t in tensors.values())
        _write_json(index, data)


def _restore_maps(source: Path) -> Edit:
    from safetensors.torch import load_file

    bf16 = load_file(source / "model.safetensors")

    def edit(tensors: dict) -> None:
        for name in ("d2t", "t2d"):
            tensors[name] = bf16[name].clone()

    return edit


def _drop(name: str) -> Edit:
    def edit(tensors: dict) -> None:
        del tensors[name]

    return edit


def _zero(name: str) -> Edit:
    def edit(tensors: dict) -> None:
        tensors[name] = tensors[name].clone().zero_()

    return edit


def _divide_input_scales(tensors: dict) -> None:
    scales = [name for name in tensors if name.endswith(".input_scale")]
    if not scales:
        raise Refused("no input_scale to divide")
    for name in scales:
        tensors[name] = tensors[name] / CLIP_DIVISOR


# --- the record ---------------------------------------------------------------------------


def _describe(fixture: Fixture, folder: Path, source: Path, pair: str) -> dict:
    import torch
    from safetensors.torch import load_file

    config = json.loads((folder / "config.json").read_text())
    quant = config.get("quantization_config", {})
    tensors = load_file(folder / "model.safetensors")
    record: dict = {
        "tool": fixture.tool,
        "version": importlib.metadata.version(
            "nvidia-modelopt" if fixture.tool == "nvidia-modelopt" else "llmcompressor"
        ),
        "command": fixture.command,
        "derived_from": fixture.derived_from,
        "purpose": fixture.purpose,
        "defects": fixture.defects,
        "declared": {
            key: quant.get(key)
            for key in ("quant_method", "quant_algo", "format", "exclude_modules", "ignore")
            if key in quant
        },
        "scales": {
            name: {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}
            for name, t in sorted(tensors.items())
            if name.endswith("_scale")
        },
        "stored": {
            name: str(t.dtype).removeprefix("torch.") for name, t in sorted(tensors.items())
        },
        "files": _folder_digests(folder),
        **NOTES.get(fixture.name, {}),
    }
    groups = quant.get("config_groups")
    if groups:
        record["declared"]["config_groups"] = {
            name: {
                "targets": group.get("targets"),
                "weights": _args(group.get("weights")),
                "input_activations": _args(group.get("input_activations")),
            }
            for name, group in groups.items()
        }
    d2t = tensors["d2t"]
    if d2t.dtype != torch.int64:
        original = load_file(source / "model.safetensors")["d2t"]
        record["d2t_changed"] = {
            "dtype": str(d2t.dtype).removeprefix("torch."),
            "entries_changed": int((d2t.to(torch.int64) != original).sum()),
            "entries": int(original.numel()),
        }
    return record


def _args(args: dict | None) -> dict | None:
    if args is None:
        return None
    keys = ("strategy", "dynamic", "block_structure", "group_size", "observer")
    return {key: args.get(key) for key in keys}


def _folder_digests(folder: Path) -> dict[str, str]:
    return {p.name: _sha256(p) for p in sorted(folder.iterdir()) if p.is_file()}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _replace(new: Path, final: Path) -> None:
    """Move a finished fixture into place; the previous one goes only once it is."""
    old = final.with_name(f".old-{final.name}")
    if old.exists():
        shutil.rmtree(old)
    if final.exists():
        final.rename(old)
    new.rename(final)
    if old.exists():
        shutil.rmtree(old)


def _write_json(path: Path, data: dict) -> None:
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(data, indent=2) + "\n")
    partial.replace(path)


if __name__ == "__main__":
    sys.exit(main())
