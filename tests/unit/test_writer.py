"""Writing: huggingface_hub sharding, exact index JSON, byte-identical pass-through, atomicity."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from eaglequant.cli.options import int_list, shard_size
from eaglequant.errors import InputError, OutputError
from eaglequant.io.checkpoint import read_checkpoint
from eaglequant.io.layout import TensorBlob, blob_from_file, blob_from_tensor, plan_layout
from eaglequant.io.output import atomic_output_dir, check_output_path
from eaglequant.io.readback import ReadBack, readback, sha256_file
from eaglequant.io.writer import LayoutWriter, write_checkpoint_weights
from tests.conftest import tree_digest


def _blobs() -> list:
    return [
        blob_from_tensor("a.weight", torch.arange(300, dtype=torch.float32).reshape(30, 10)),
        blob_from_tensor("b.weight", torch.ones(50, dtype=torch.bfloat16)),
        blob_from_tensor("c.weight", torch.zeros(250, dtype=torch.float32)),
        blob_from_tensor("d", torch.arange(4, dtype=torch.int64)),
    ]


def test_small_shard_size_gives_exact_index(tmp_path: Path) -> None:
    files = write_checkpoint_weights(tmp_path, _blobs(), max_shard_size=1200)
    assert files == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
    ]
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert index == {
        "metadata": {"total_size": 1200 + 100 + 1000 + 32},
        "weight_map": {
            "a.weight": "model-00001-of-00002.safetensors",
            "b.weight": "model-00002-of-00002.safetensors",
            "c.weight": "model-00002-of-00002.safetensors",
            "d": "model-00002-of-00002.safetensors",
        },
    }
    with safe_open(str(tmp_path / files[0]), framework="pt") as handle:
        assert handle.metadata() == {"format": "pt"}
        assert torch.equal(handle.get_tensor("a.weight"), torch.arange(300.0).reshape(30, 10))
    for name in files:
        assert stat.S_IMODE(os.stat(tmp_path / name).st_mode) == 0o644


def test_single_shard_has_no_index(tmp_path: Path) -> None:
    assert write_checkpoint_weights(tmp_path, _blobs(), 10**9) == ["model.safetensors"]
    assert not (tmp_path / "model.safetensors.index.json").exists()


def test_file_backed_blobs_are_byte_identical(sharded_draft: Path, tmp_path: Path) -> None:
    src = read_checkpoint(sharded_draft)
    write_checkpoint_weights(tmp_path, [blob_from_file(t) for t in src.tensors.values()], 10**9)
    (tmp_path / "config.json").write_text(json.dumps(src.config))
    copy = read_checkpoint(tmp_path)
    assert all(copy.read_raw(n) == src.read_raw(n) for n in src.tensors)


@pytest.mark.parametrize(
    ("text", "expected"), [("5GB", 5 * 10**9), ("500MB", 5 * 10**8), ("123", 123)]
)
def test_parse_shard_size(text: str, expected: int) -> None:
    assert shard_size(text) == expected


@pytest.mark.parametrize("text", ["five", "5XB", "0", "-3MB"])
def test_unparsable_shard_size(text: str) -> None:
    with pytest.raises(InputError, match="--max-shard-size"):
        shard_size(text)


@pytest.mark.parametrize(("text", "pattern"), [("1,x", "comma-separated"), ("0,2", "at least 1")])
def test_int_list_names_its_option(text: str, pattern: str) -> None:
    assert int_list("4,6,8", "--k", minimum=1, example="4,6,8") == (4, 6, 8)
    with pytest.raises(InputError, match=f"--k '{text}': .*{pattern}"):
        int_list(text, "--k", minimum=1, example="4,6,8")


def test_atomic_output_appears_only_on_success(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(RuntimeError), atomic_output_dir(out, overwrite=False) as temp:
        (temp / "half.txt").write_text("x")
        raise RuntimeError("boom")
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == []
    with atomic_output_dir(out, overwrite=False) as temp:
        (temp / "done.txt").write_text("x")
    assert (out / "done.txt").read_text() == "x"
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o755


def test_output_rules(tmp_path: Path, tiny_draft: Path) -> None:
    with pytest.raises(OutputError, match="may not be the input folder"):
        check_output_path(tiny_draft, [tiny_draft], overwrite=True)
    with pytest.raises(OutputError, match="may not be the input folder"):
        check_output_path(tiny_draft / "sub", [tiny_draft], overwrite=False)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "f").write_text("x")
    with pytest.raises(OutputError, match="exists and is not empty; pass --overwrite"):
        check_output_path(busy, [tiny_draft], overwrite=False)
    check_output_path(busy, [tiny_draft], overwrite=True)


def test_overwrite_replaces_and_race_loser_fails_cleanly(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    with atomic_output_dir(out, overwrite=True) as temp:
        (temp / "new.txt").write_text("new")
    assert sorted(p.name for p in out.iterdir()) == ["new.txt"]
    race = tmp_path / "race"
    with (
        pytest.raises(OutputError, match="appeared while this run was writing"),
        atomic_output_dir(race, overwrite=False) as temp,
    ):
        (temp / "mine.txt").write_text("x")
        race.mkdir()
        (race / "theirs.txt").write_text("y")
    assert sorted(p.name for p in (tmp_path / "race").iterdir()) == ["theirs.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "race"]


def test_layout_with_pending_tensors_equals_a_one_shot_write(tmp_path: Path) -> None:
    blobs = _blobs()
    pending = {blobs[0].name: blobs[0].data, blobs[3].name: blobs[3].data}
    planned = [TensorBlob(b.name, b.dtype, b.shape) if b.name in pending else b for b in blobs]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    writer = LayoutWriter(tmp_path / "a", plan_layout(planned, max_shard_size=1200))
    writer.start_background()
    writer.finish(pending)  # type: ignore[arg-type]
    write_checkpoint_weights(tmp_path / "b", blobs, max_shard_size=1200)
    assert tree_digest(tmp_path / "a") == tree_digest(tmp_path / "b")
    with pytest.raises(ValueError, match="pending tensors planned as"):
        LayoutWriter(tmp_path / "a", plan_layout(planned, 1200)).finish({"d": b"x"})


def test_readback_hashes_files_and_finds_changed_bytes(sharded_draft: Path, tmp_path: Path) -> None:
    src = read_checkpoint(sharded_draft)
    blobs = [blob_from_file(t) for t in src.tensors.values()]
    blobs.append(TensorBlob("extra", "F32", (4,)))
    layout = plan_layout(blobs, max_shard_size=20_000)
    writer = LayoutWriter(tmp_path, layout)
    writer.write_known()
    extra = bytes(range(16))
    writer.finish({"extra": extra})
    digests, problems = readback(tmp_path, layout, {"extra": extra})
    assert problems == [] and len(digests) == len(layout.files) > 1
    assert digests == {f.name: sha256_file(tmp_path / f.name) for f in layout.files}
    shard, placed = layout.placement("fc.weight")
    with (tmp_path / shard.name).open("r+b") as handle:
        handle.seek(placed.start + 5)
        byte = handle.read(1)
        handle.seek(placed.start + 5)
        handle.write(bytes([byte[0] ^ 1]))
    _, problems = readback(tmp_path, layout, {"extra": bytes(16)})
    assert sorted(problems) == [
        "tensor 'extra' is not byte-identical to its quantized bytes",
        "tensor 'fc.weight' is not byte-identical to its input",
    ]


def test_readback_resumes_after_the_pending_bytes(sharded_draft: Path, tmp_path: Path) -> None:
    """Read back early up to each file's first pending tensor, finish once it is written."""
    src = read_checkpoint(sharded_draft)
    blobs = [blob_from_file(t) for t in src.tensors.values()]
    blobs.append(TensorBlob("midlayer.zz", "F32", (4,)))  # sorts among the midlayer tensors
    layout = plan_layout(blobs, max_shard_size=20_000)
    writer = LayoutWriter(tmp_path, layout)
    writer.write_known()
    early = ReadBack(tmp_path, layout)
    early.advance()
    shard, placed = layout.placement("midlayer.zz")
    file = next(f for f in early.files if f.path.name == shard.name)
    assert file.checked == shard.placements.index(placed)  # stopped at the pending tensor
    assert all(f.checked == len(f.shard.placements) for f in early.files if f is not file)
    given = {"midlayer.zz": bytes(range(16))}
    writer.finish(given)
    digests, problems = early.finish(given)
    assert problems == []
    assert digests == readback(tmp_path, layout, given)[0]
    assert digests == {f.name: sha256_file(tmp_path / f.name) for f in layout.files}
    stopped = ReadBack(tmp_path, layout)
    stopped.advance(stop=lambda: True)
    assert all(f.checked == 0 for f in stopped.files)  # headers only


def test_replanned_artifact_reports_the_layout_it_wrote(tiny_draft: Path, tmp_path: Path) -> None:
    """Quark wrote other tensors than predicted: the artifact re-plans with its one writer."""
    from eaglequant.quantize.artifact import Artifact
    from eaglequant.recipe import load_recipe
    from eaglequant.rules.draft import MIDLAYER_LINEARS

    source, folder = read_checkpoint(tiny_draft), tmp_path / "out"
    folder.mkdir()
    artifact = Artifact.start(folder, source, load_recipe("fp8-static"), 10**9)
    quantized = {}  # per-channel scales and no input scales: not the static prediction
    for name in MIDLAYER_LINEARS:
        shape = source.tensors[f"{name}.weight"].shape
        quantized[f"{name}.weight"] = torch.zeros(shape, dtype=torch.float8_e4m3fn)
        quantized[f"{name}.weight_scale"] = torch.ones(shape[0])
    artifact.finish(quantized, source.config)
    artifact.cancel()
    written = {p.blob.name for f in artifact.layout.files for p in f.placements}
    replaced = {f"{name}.weight" for name in MIDLAYER_LINEARS}
    assert written == set(source.tensors) - replaced | set(quantized)
    _digests, problems = readback(folder, artifact.layout, artifact.quantized)
    assert problems == []


def test_a_failed_last_fsync_fails_verify(
    tiny_draft: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last fsync runs beside verify's read-back; its error still ends the export."""
    from eaglequant.quantize.artifact import Artifact, predicted_quantized
    from eaglequant.recipe import load_recipe

    source, folder = read_checkpoint(tiny_draft), tmp_path / "out"
    folder.mkdir()
    recipe = load_recipe("fp8-static")
    artifact = Artifact.start(folder, source, recipe, 10**9)
    artifact.writer.wait()  # the background copy's own fsync has run

    def failing_sync() -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(artifact.writer, "sync", failing_sync)
    quantized = {  # exactly as predicted: the planned layout is kept
        blob.name: torch.zeros(blob.shape, dtype=torch.float8_e4m3fn)
        if blob.dtype == "F8_E4M3"
        else torch.ones(blob.shape)
        for blob in predicted_quantized(source, recipe)
    }
    artifact.finish(quantized, source.config)
    with pytest.raises(OSError, match="Input/output error"):
        artifact.verify()
    assert "background.final_fsync" in artifact.timings
    assert "verify.wait_fsync" in artifact.timings
    artifact.cancel()
