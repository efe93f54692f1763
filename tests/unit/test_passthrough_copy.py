"""The export's pass-through copy: unchanged tensors go from input to output by byte range.

The writer plans each output file's header itself and copies every unchanged
tensor's bytes into place (``os.copy_file_range``, or a read/write loop where the
file systems refuse it); the read-back, which reads every byte once, checks the
float tensors for NaN/Inf as the bytes stream past.
"""

from __future__ import annotations

import errno
import json
import math
import os
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

from eaglequant.errors import InputError
from eaglequant.io import readback as readback_module
from eaglequant.io import writer as writer_module
from eaglequant.io.layout import TensorBlob, blob_from_file, plan_layout
from eaglequant.io.readback import ReadBack
from eaglequant.io.safetensors_header import DTYPE_SIZES, FLOAT_DTYPES, TensorInfo, read_header
from eaglequant.io.writer import LayoutWriter, write_checkpoint_weights, write_safetensors
from eaglequant.model.finite import all_finite_bytes, check_finite_chunk
from tests.conftest import tree_digest

TORCH_DTYPES = {
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F32": torch.float32,
    "F64": torch.float64,
}
NOT_IN_TORCH = {"F8_E8M0"}  # safetensors' torch loader has no dtype for it here


def _values(dtype: str, count: int, seed: int) -> bytes:
    """Finite values for the float dtypes the check covers, random bytes for the others."""
    if dtype in TORCH_DTYPES:
        generator = torch.Generator().manual_seed(seed)
        values = torch.randn(count, generator=generator, dtype=torch.float64) * 100
        flat = values.to(TORCH_DTYPES[dtype]).reshape(-1)
        return bytes(flat.view(torch.uint8).numpy())
    if dtype == "BOOL":
        return bytes(np.random.default_rng(seed).integers(0, 2, count, dtype=np.uint8))
    return np.random.default_rng(seed).bytes(count * DTYPE_SIZES[dtype])


def _source(path: Path, extra: list[TensorBlob] = ()) -> dict[str, TensorInfo]:  # type: ignore[assignment]
    """One tensor of every safetensors dtype (odd sizes: offsets not multiples of 8) + ``extra``."""
    blobs = [
        TensorBlob(f"t.{dtype.lower()}", dtype, (3, 5 + i), _values(dtype, 3 * (5 + i), i))
        for i, dtype in enumerate(sorted(DTYPE_SIZES))
    ]
    write_safetensors(path, blobs + list(extra))
    return read_header(path).tensors


def _copy(
    folder: Path,
    infos: dict[str, TensorInfo],
    max_shard_size: int = 10**9,
    check: Callable[[TensorInfo, memoryview], None] = check_finite_chunk,
) -> None:
    """Copy as the export does: the writer, then the read-back with the NaN/Inf check."""
    folder.mkdir()
    layout = plan_layout([blob_from_file(info) for info in infos.values()], max_shard_size)
    writer = LayoutWriter(folder, layout)
    writer.write_known()
    writer.finish({})
    _digests, problems = ReadBack(folder, layout, check_chunk=check).finish({})
    assert problems == []


def _big_bf16(name: str, elements: int, bad: dict[int, float] | None = None) -> TensorBlob:
    values = torch.linspace(-3e38, 3e38, elements, dtype=torch.float64).to(torch.bfloat16)
    for index, value in (bad or {}).items():
        values[index] = value
    return TensorBlob(name, "BF16", (elements,), bytes(values.view(torch.uint8).numpy()))


def test_every_dtype_is_copied_into_a_header_of_its_own(tmp_path: Path) -> None:
    infos = _source(tmp_path / "in.safetensors")
    _copy(tmp_path / "out", infos)
    path = tmp_path / "out" / "model.safetensors"
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    assert (8 + length) % 8 == 0  # the data starts 8-byte aligned, the header padded with spaces
    header = json.loads(raw[8 : 8 + length])
    assert header.pop("__metadata__") == {"format": "pt"}
    assert list(header) == sorted(infos)
    position = 0
    for name, entry in header.items():  # contiguous, in name order, each its dtype's size
        size = math.prod(entry["shape"]) * DTYPE_SIZES[entry["dtype"]]
        assert entry["data_offsets"] == [position, position + size]
        assert (entry["dtype"], tuple(entry["shape"])) == (infos[name].dtype, infos[name].shape)
        position += size
    assert len(raw) == 8 + length + position
    copied = read_header(path).tensors  # the strict reader accepts it
    assert all(copied[name].same_bytes(info) for name, info in infos.items())
    with (
        safe_open(str(path), framework="pt") as mine,
        safe_open(str(tmp_path / "in.safetensors"), framework="pt") as theirs,
    ):
        assert mine.metadata() == {"format": "pt"}
        readable = [n for n, info in infos.items() if info.dtype not in NOT_IN_TORCH]
        assert len(readable) == len(infos) - len(NOT_IN_TORCH)
        for name in readable:  # bit for bit (the random FP8 bytes hold NaNs)
            a, b = (h.get_tensor(name).reshape(-1).view(torch.uint8) for h in (mine, theirs))
            assert mine.get_tensor(name).dtype == theirs.get_tensor(name).dtype
            assert torch.equal(a, b), name


def test_copied_bytes_equal_a_write_from_memory(tmp_path: Path) -> None:
    """Sharded: the byte-range copy writes the same files as writing the tensors' bytes."""
    infos = _source(tmp_path / "in.safetensors", [_big_bf16("big", 5000)])
    _copy(tmp_path / "copied", infos, max_shard_size=2000)
    blobs = [
        TensorBlob(info.name, info.dtype, info.shape, info.file.read_bytes()[info.start : info.end])
        for info in infos.values()
    ]
    (tmp_path / "memory").mkdir()
    write_checkpoint_weights(tmp_path / "memory", blobs, max_shard_size=2000)
    assert len(list((tmp_path / "memory").iterdir())) > 2  # shards and the index
    assert tree_digest(tmp_path / "copied") == tree_digest(tmp_path / "memory")


@pytest.mark.parametrize("dtype", sorted(FLOAT_DTYPES))
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_nan_or_inf_in_a_late_chunk_is_found_and_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dtype: str, bad: float
) -> None:
    monkeypatch.setattr(readback_module, "CHUNK", 64)  # many chunks per tensor
    values = torch.randn(1000, dtype=torch.float64).to(TORCH_DTYPES[dtype])
    values[7] = torch.finfo(TORCH_DTYPES[dtype]).max  # all exponent bits but one: finite
    values[8] = -torch.finfo(TORCH_DTYPES[dtype]).max
    values[9] = -0.0
    clean = bytes(values.view(torch.uint8).numpy())
    values[[990, 995]] = bad
    infos = _source(
        tmp_path / "in.safetensors",
        [
            TensorBlob("clean", dtype, (1000,), clean),
            TensorBlob("w.bad", dtype, (1000,), bytes(values.view(torch.uint8).numpy())),
        ],
    )
    with pytest.raises(InputError) as caught:
        _copy(tmp_path / "out", infos)
    assert str(caught.value) == (
        f"{tmp_path / 'in.safetensors'}: tensor 'w.bad' holds 2 NaN/Inf value(s); "
        "the checkpoint is corrupt, re-export it from a healthy training run"
    )
    del infos["w.bad"]
    _copy(tmp_path / "clean", infos)  # everything else, max and -0 included, passes


def test_the_fast_test_agrees_with_torch_on_every_bf16_pattern() -> None:
    """All 65536 BF16 bit patterns, one at a time: NaN/Inf exactly where torch says."""
    patterns = np.arange(2**16, dtype=np.uint16)
    expected = ~torch.isfinite(torch.from_numpy(patterns.view(np.int16)).view(torch.bfloat16))
    found = [not all_finite_bytes("BF16", memoryview(p.tobytes())) for p in patterns]
    assert torch.equal(torch.tensor(found), expected)
    assert all_finite_bytes("BF16", memoryview(b""))


def test_without_copy_file_range_the_loop_copies_and_checks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file system that refuses copy_file_range (EXDEV): same bytes, the NaN still found."""
    infos = _source(tmp_path / "in.safetensors", [_big_bf16("big", 50_000)])
    _copy(tmp_path / "kernel", infos)
    refused: list[int] = []

    def exdev(*args: object) -> int:
        refused.append(1)
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))

    monkeypatch.setattr(os, "copy_file_range", exdev)
    monkeypatch.setattr(writer_module, "LOOP_CHUNK", 4096)  # many turns of the loop
    _copy(tmp_path / "loop", infos)
    assert refused  # the loop ran
    assert tree_digest(tmp_path / "loop") == tree_digest(tmp_path / "kernel")
    bad = _source(tmp_path / "bad.safetensors", [_big_bf16("big", 50_000, {49_999: math.nan})])
    with pytest.raises(InputError, match="tensor 'big' holds 1 NaN/Inf"):
        _copy(tmp_path / "bad", bad)


def test_short_kernel_copies_and_chunked_checks_see_every_byte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """copy_file_range may copy less than asked: the writer goes on; the check sees whole
    elements of every pass-through tensor, chunk by chunk."""
    real = os.copy_file_range
    monkeypatch.setattr(
        os, "copy_file_range", lambda src, dst, count, *at: real(src, dst, min(count, 7), *at)
    )
    monkeypatch.setattr(readback_module, "CHUNK", 1000)
    seen: list[tuple[str, int]] = []

    def check(info: TensorInfo, chunk: memoryview) -> None:
        seen.append((info.name, len(chunk)))
        check_finite_chunk(info, chunk)

    infos = _source(tmp_path / "in.safetensors", [_big_bf16("big", 5000)])
    _copy(tmp_path / "out", infos, check=check)
    copied = read_header(tmp_path / "out" / "model.safetensors").tensors
    assert all(copied[name].same_bytes(info) for name, info in infos.items())
    assert [size for name, size in seen if name == "big"] == [1000] * 10
    assert sum(size for name, size in seen if name == "t.bf16") == infos["t.bf16"].nbytes
    assert {name for name, _ in seen} == set(infos)  # every tensor streamed past the check


def test_copy_file_range_failing_midway_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused before any byte moved: the loop copies; failing after some did: the error."""
    real, calls = os.copy_file_range, []

    def fail_second(src: int, dst: int, count: int, *at: int) -> int:
        calls.append(count)
        if len(calls) == 2:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(src, dst, min(count, 8), *at)

    monkeypatch.setattr(os, "copy_file_range", fail_second)
    infos = _source(tmp_path / "in.safetensors", [_big_bf16("big", 5000)])
    with pytest.raises(OSError, match="Input/output error"):
        _copy(tmp_path / "out", {"big": infos["big"]})
