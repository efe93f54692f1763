"""Quark's file-to-file flow in a worker process started with the export (parent side).

``import quark.torch`` costs one core several seconds even with its scan of the
transformers modeling files skipped (``quark_backend.import_quark``). The
dynamic-activation recipes therefore start Quark in a child process as the
export starts: there it imports on its own core, without this process's GIL,
while this process plans, copies, checks, fsyncs and reads back the
pass-through tensors and stages the decoder layers' weights. The child then takes
one request (the staged folder, the recipe), runs
``ModelQuantizer.direct_quantize_checkpoint`` and leaves its timings in a JSON
file (:mod:`.quark_worker` is the child's side); its allocator reuses the memory it frees
(:func:`worker_environment`). The scratch folder (the staged weights, Quark's output) is in
shared memory where there is room, so its gigabytes never reach the disk. Light: nothing
heavy is imported here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import TypedDict

from eaglequant.errors import EagleQuantError, OutputError, QuarkFailed
from eaglequant.io.checkpoint import Checkpoint
from eaglequant.io.layout import blob_from_file
from eaglequant.io.writer import write_checkpoint_weights, write_text
from eaglequant.quantize.timing import InThread
from eaglequant.recipe import Recipe
from eaglequant.rules.draft import dims_from_config

SCRATCH_PREFIX = ".eaglequant-quark-"
SOURCE, RESULT, REPORT, LOG = "midlayer-bf16", "quark-out", "report.json", "quark.log"
WORKER = "eaglequant.quantize.quark_worker"
SHARED_MEMORY = Path("/dev/shm")
# glibc's allocator in the worker: no block from mmap, no freed memory given back (see
# worker_environment); the user's own settings of these keys win.
WORKER_MALLOC = {"glibc.malloc.mmap_max": "0", "glibc.malloc.trim_threshold": str(1 << 40)}
TUNABLES = "GLIBC_TUNABLES"


class WorkerReport(TypedDict, total=False):
    """``report.json``: the worker's timings, or the error that stopped it."""

    timings: dict[str, float]
    error: str  # the exception's class name
    message: str
    io: bool  # a SafetensorError: Quark could not write its output


class FileToFile:
    """The decoder layers' file-to-file quantization, under way from the export's start.

    Creating one makes the scratch folder, starts the worker (which imports
    Quark) and stages the decoder layers' linear weights in a thread; ``run`` hands
    the worker its request and waits; ``close`` stops the worker if it still
    runs and removes the scratch folder.
    """

    def __init__(self, ckpt: Checkpoint, recipe: Recipe, scratch_parent: Path, out: Path) -> None:
        self.recipe, self.out = recipe, out
        self.linears = dims_from_config(ckpt.flat_config).linears  # every decoder layer's
        parent = in_memory_scratch(layer_weight_bytes(ckpt)) or scratch_parent
        self.scratch = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=parent))
        self.timings: dict[str, float] = {}
        try:
            with (self.scratch / LOG).open("wb") as log:
                self.process = subprocess.Popen(
                    [sys.executable, "-m", WORKER, str(self.scratch)],
                    stdin=subprocess.PIPE,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=worker_environment(os.environ),
                )
        except BaseException:
            shutil.rmtree(self.scratch, ignore_errors=True)
            raise
        self._staging = InThread(partial(self._stage, ckpt), self.timings, "stage_midlayer")

    def run(self) -> Path:
        """Wait for the staged midlayer, let Quark quantize it; the folder Quark wrote."""
        self._staging.result()
        assert self.process.stdin is not None
        request = {"recipe": self.recipe.to_dict()}
        try:
            self.process.stdin.write(json.dumps(request).encode() + b"\n")
            self.process.stdin.close()
        except BrokenPipeError:
            pass  # the worker already died: its report or log says why
        self.process.wait()
        report = self._report()
        self.timings.update(report.get("timings", {}))
        if "error" in report:
            raise self._failure(report)
        return self.scratch / RESULT

    def close(self) -> None:
        """Stop the worker if it still runs, remove the scratch folder (again: a no-op)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._staging.wait()
        shutil.rmtree(self.scratch, ignore_errors=True)

    def _stage(self, ckpt: Checkpoint) -> None:
        """A model folder holding only the decoder layers' linear weights (and the config);
        in its own thread, its error re-raised by :meth:`run`."""
        folder = self.scratch / SOURCE
        folder.mkdir()
        # named in the EAGLE-3 layout whatever the input's format: Quark's output is read so
        names = [f"{name}.weight" for name in self.linears]
        blobs = [blob_from_file(ckpt.tensors[name], name) for name in names]
        write_checkpoint_weights(folder, blobs, 10**15)
        write_text(folder / "config.json", json.dumps(ckpt.flat_config))

    def _report(self) -> WorkerReport:
        path = self.scratch / REPORT
        if path.is_file():
            report: WorkerReport = json.loads(path.read_text())
            return report
        lines = (self.scratch / LOG).read_text(errors="replace").strip().splitlines()
        last = lines[-1] if lines else f"exit status {self.process.returncode}"
        return {"error": "WorkerDied", "message": last}

    def _failure(self, report: WorkerReport) -> EagleQuantError:
        if report.get("io"):
            return quark_write_error(self.out, self.scratch, report["message"])
        return QuarkFailed(
            f"Quark's direct_quantize_checkpoint failed: {report['error']}: "
            f"{report['message'][:300]}; nothing was published"
        )


def worker_environment(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with glibc's allocator set to reuse the worker's freed memory (``GLIBC_TUNABLES``
    gets :data:`WORKER_MALLOC`'s keys that it does not set already).

    Quark's file-to-file flow makes float32 copies of each weight, hundreds of megabytes
    apiece. By default glibc serves each from fresh ``mmap`` pages and unmaps it when freed,
    so the kernel zeroes and faults in every page again: 1.7 million page faults for the
    full-size Kimi-K2.5 midlayer. With ``mmap`` off and the heap never trimmed, the freed
    blocks are reused (``bench/export_bench.py``). The worker ends after its one folder;
    what it keeps is its peak, which it reached anyway. Other C libraries ignore the variable.
    """
    settings = [item for item in env.get(TUNABLES, "").split(":") if item]
    named = {item.split("=", 1)[0] for item in settings}
    settings += [f"{key}={value}" for key, value in WORKER_MALLOC.items() if key not in named]
    return {**env, TUNABLES: ":".join(settings)}


def layer_weight_bytes(ckpt: Checkpoint) -> int:
    """Bytes of every decoder layer's linear weights as stored: what Quark quantizes."""
    linears = dims_from_config(ckpt.flat_config).linears
    return sum(ckpt.tensors[f"{name}.weight"].nbytes for name in linears)


def in_memory_scratch(staged: int) -> Path | None:
    """Shared memory (``/dev/shm``) when it and the RAM have room for twice the staged BF16
    weights and Quark's FP8 output (half their size), else None: beside the output.

    The scratch folder lives for seconds and is read once; on the disk its
    gigabytes would be written back beside the output's.
    """
    try:
        room = shutil.disk_usage(SHARED_MEMORY).free
        available = _memory_available()
    except OSError:
        return None
    if not os.access(SHARED_MEMORY, os.W_OK) or min(room, available) < 2 * (staged + staged // 2):
        return None
    return SHARED_MEMORY


def _memory_available() -> int:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes (OSError where there is none)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise OSError("no MemAvailable in /proc/meminfo")


def quark_write_error(out: Path, scratch: Path | str, message: str) -> OutputError:
    """Quark could not write its output into the scratch folder (a full disk)."""
    return OutputError(
        f"{out}: I/O error while writing Quark's output in {scratch}: {message}; "
        "nothing was written and the input is untouched, free space and rerun"
    )
