"""The static FP8 linear compiled for CPUs with AVX512-BF16: built, checked, called.

``cpu_fp8_kernel.c`` ships in the package. On first use in a process it is compiled with
the system C compiler (``$CC``, else ``cc``) into ``$EAGLEQUANT_CACHE/kernels`` (one file
per source, flags and compiler; written atomically, so concurrent engines may race),
loaded with ctypes, and checked against torch before it is used: vLLM's static input
quantization on every one of the 65,536 BF16 inputs at several scales, and a GEMM whose
every sum is exact in float32, bit for bit. Unavailable (no AVX512-BF16, as under
``tests/as_avx2``; no compiler; a failed build or check): :func:`kernel` is None and
:func:`unavailable` says why, and :mod:`eaglequant.engine.cpu_fp8_gemm` keeps vLLM's
oneDNN GEMM. The library runs on torch's OpenMP runtime (``libgomp.so.1``, loaded by
torch first), so it shares vLLM's threads.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

from eaglequant.io.packaged import cache_root
from eaglequant.recipe import FP8_E4M3_MAX

SOURCE = "cpu_fp8_kernel.c"
FLAGS = (
    "-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512bf16",
    "-fopenmp", "-shared", "-fPIC",
)  # fmt: skip
BUILD_TIMEOUT_S = 300.0
# The CPU plugin's logger, under vLLM's (its handlers print the line); its home is here, the
# lowest of the plugin's modules, so that the plugin imports it without a cycle.
LOGGER = "vllm.eaglequant_cpu_plugin"


class Unavailable(RuntimeError):
    """Why the kernel cannot be used in this process (one line)."""


class NativeKernel:
    """The loaded library: :meth:`linear` makes a layer's callable; :meth:`quantize` is
    the input quantization alone (for the checks)."""

    def __init__(self, library: ctypes.CDLL) -> None:
        pointer, size, number = ctypes.c_void_p, ctypes.c_long, ctypes.c_int
        self._linear = library.eq_fp8_static_linear
        self._linear.argtypes = [
            pointer, size, number, number, ctypes.c_float, pointer, pointer, number, pointer, size
        ]  # fmt: skip
        self._linear.restype = number
        self._quantize = library.eq_quantize
        self._quantize.argtypes = [pointer, size, number, number, ctypes.c_float, pointer]
        self._quantize.restype = number
        self.columns = int(library.eq_columns())

    def quantize(self, x: Any, inverse: float) -> Any:
        """``x`` (rows x k, BF16) quantized as vLLM quantizes a static input, as BF16 values."""
        # lazy: torch-free core
        import torch

        rows, k = x.shape
        out = torch.empty(rows, k + k % 2, dtype=torch.bfloat16)
        self._quantize(x.data_ptr(), x.stride(0), rows, k, inverse, out.data_ptr())
        return out[:, :k]

    def linear(self, weight: Any, scale: Any, inverse: Any) -> NativeLinear:
        """The layer's static FP8 linear: ``weight`` ``(K, N)`` E4M3 as vLLM's torch FP8
        kernels hold it, ``scale`` the output scales ``(1, N)`` (input times weight scale),
        ``inverse`` the input scale's reciprocal (one float32 value)."""
        return NativeLinear(self, weight, scale, float(inverse.reshape(-1)[0]))


class NativeLinear:
    """``into(out, x)``: ``out`` (rows x N, BF16) = the static FP8 linear of ``x`` (rows x K,
    BF16, unit stride along K). Holds the packed weight and the scales it points to."""

    def __init__(self, kernel: NativeKernel, weight: Any, scale: Any, inverse: float) -> None:
        # lazy: torch-free core
        import torch

        k, n = weight.shape
        columns = kernel.columns
        padded = torch.zeros(-(-n // columns) * columns, k + k % 2, dtype=torch.bfloat16)
        padded[:n, :k] = weight.t().to(torch.bfloat16)  # exact: every E4M3 value is a BF16 one
        # [N / columns][K / 2][columns][2]: a tile's 4 vectors of 16 column pairs, k by k
        packed = padded.view(-1, columns, padded.shape[1] // 2, 2).permute(0, 2, 1, 3)
        self._packed = packed.contiguous()
        # one per column: a per-tensor scale is one value for all of them
        self._scale = torch.broadcast_to(scale.reshape(1, -1).float(), (1, n)).reshape(-1).clone()
        self._run, self._inverse, self.outputs, self.inputs = kernel._linear, inverse, n, k
        self._pointers = (self._packed.data_ptr(), self._scale.data_ptr())

    def into(self, out: Any, x: Any) -> None:
        if x.shape[1] != self.inputs or out.shape != (x.shape[0], self.outputs):
            raise ValueError(
                f"FP8 linear {self.inputs} -> {self.outputs}: input {tuple(x.shape)}, "
                f"output {tuple(out.shape)}"
            )
        packed, scale = self._pointers
        failed = self._run(
            x.data_ptr(), x.stride(0), x.shape[0], self.inputs, self._inverse,
            packed, scale, self.outputs, out.data_ptr(), out.stride(0),
        )  # fmt: skip
        if failed:
            raise MemoryError(f"{SOURCE}: no scratch memory for {x.shape[0]} input rows")


def kernel() -> NativeKernel | None:
    """The checked kernel, or None (:func:`unavailable` says why; logged once)."""
    return _loaded()[0]


def unavailable() -> str | None:
    """Why :func:`kernel` is None in this process, or None when it is not."""
    return _loaded()[1]


@functools.cache
def _loaded() -> tuple[NativeKernel | None, str | None]:
    try:
        loaded = NativeKernel(_open(build()))
        check(loaded)
    except Unavailable as why:
        logging.getLogger(LOGGER).info("eaglequant's CPU FP8 kernel is not used: %s", why)
        return None, str(why)
    return loaded, None


def _open(library: Path) -> ctypes.CDLL:
    try:
        return ctypes.CDLL(str(library))
    except OSError as error:  # e.g. a cache folder mounted noexec
        raise Unavailable(f"{library.name} does not load: {error}") from None


def build(source: bytes | None = None) -> Path:
    """The compiled library for this CPU, built on first use (:class:`Unavailable`: why not);
    ``source``: another C text than the shipped one (the checks' own tests build mutants)."""
    # lazy: torch-free core
    import torch

    if not torch.cpu._is_avx512_bf16_supported():
        raise Unavailable("this CPU has no AVX512-BF16 (VDPBF16PS)")
    compiler = shutil.which(os.environ.get("CC") or "cc")
    if compiler is None:
        raise Unavailable("no C compiler on PATH (set CC to one)")
    if source is None:
        source = resources.files(__package__).joinpath(SOURCE).read_bytes()
    version = _run([compiler, "--version"]).stdout.partition("\n")[0]
    key = hashlib.sha256(b"\0".join([source, " ".join(FLAGS).encode(), version.encode()]))
    folder = cache_root() / "kernels"
    target = folder / f"{Path(SOURCE).stem}-{key.hexdigest()[:16]}.so"
    if target.is_file():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".build-") as scratch:
        (Path(scratch) / SOURCE).write_bytes(source)
        built = Path(scratch) / target.name
        result = _run([compiler, *FLAGS, "-o", str(built), str(Path(scratch) / SOURCE)])
        if result.returncode != 0 or not built.is_file():
            lines = result.stderr.replace(f"{scratch}/", "").strip().splitlines() or ["no output"]
            named = next((line for line in lines if "error" in line), lines[-1]).strip()
            raise Unavailable(f"{Path(compiler).name} could not build {SOURCE}: {named}")
        os.replace(built, target)  # atomic: a racing engine's copy is the same file
    return target


def _run(command: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise Unavailable(f"{Path(command[0]).name}: {error}") from None


def quantize_static(rows: Any, inverse: Any) -> Any:
    """vLLM's static FP8 input quantization, elementwise, as torch computes it: ``rows``
    times ``inverse`` (the scale's reciprocal, a float32 tensor with a dimension, so each
    product is taken in float32), clamped to the E4M3 range, cast with round-to-nearest-even;
    a new tensor, never the input in place. The kernel is checked against it, and the
    oneDNN path's tables are made from it."""
    # lazy: torch-free core
    import torch

    quantized = torch.mul(rows, inverse)
    quantized.clamp_(-FP8_E4M3_MAX, FP8_E4M3_MAX)
    return quantized.to(torch.float8_e4m3fn)


def check(loaded: NativeKernel) -> None:
    """Refuse (:class:`Unavailable`) a kernel that does not compute what torch does here:
    the input quantization on every BF16 input at four scales (any NaN for a NaN), and a
    linear whose every sum is exact in float32 (E4M3 values of magnitude 1/8 to 7.5, 63
    terms), bit for bit against float32 sums times the scales (per column, and one for
    all), rounded to BF16 once. The
    shapes leave partial row and column tiles and an odd K, over a strided input."""
    # lazy: torch-free core
    import torch

    every = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    every = every.reshape(256, 256)
    for inverse in (1.0, 1 / 0.013, 1 / 3.7, 1 / 117.0):
        factor = torch.tensor([inverse], dtype=torch.float32)
        expected = quantize_static(every, factor).to(torch.bfloat16)
        got = loaded.quantize(every, float(factor))
        same = (got.view(torch.int16) == expected.view(torch.int16)) | (
            got.isnan() & expected.isnan()
        )
        if not bool(same.all()):
            raise Unavailable(
                f"{SOURCE}'s input quantization differs from torch's at 1/{1 / inverse:g}"
            )
    generator = torch.Generator().manual_seed(0)
    values = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    values = values[(values.abs() >= 0.125) & (values.abs() <= 7.5) | (values == 0)]
    pick = lambda *shape: values[torch.randint(len(values), shape, generator=generator)]  # noqa: E731
    rows, k, n = 13, 63, 200
    x = pick(rows, k + 5).bfloat16()[:, :k]  # a row stride past K
    weight = pick(n, k).to(torch.float8_e4m3fn)
    sums = (x.double() @ weight.double().t()).float()  # exact, so in any order
    for scale in (torch.rand(1, n, generator=generator) + 0.01, torch.tensor([[0.37]])):
        out = torch.empty(rows, n, dtype=torch.bfloat16)
        loaded.linear(weight.t(), scale, torch.ones(1)).into(out, x)
        if not torch.equal(out, torch.mul(sums, scale).bfloat16()):
            raise Unavailable(f"{SOURCE}'s linear differs from float32 sums scaled once")
