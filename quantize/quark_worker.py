"""The worker process of Quark's file-to-file flow (the child's side of :mod:`.file_to_file`).

``python -m eaglequant.quantize.quark_worker SCRATCH``: imports Quark at once,
then reads one JSON request line on stdin (none: the export ended first),
quantizes ``SCRATCH/midlayer-bf16`` into ``SCRATCH/quark-out`` with
``ModelQuantizer.direct_quantize_checkpoint``, writes ``SCRATCH/report.json``
(its timings, or the error) and exits at once.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from eaglequant.interpreter import exit_at_once
from eaglequant.quantize.file_to_file import REPORT, RESULT, SOURCE, WorkerReport
from eaglequant.quantize.quark_backend import import_quark, quark_config
from eaglequant.quantize.timing import process_started
from eaglequant.recipe import recipe_from_dict


def main(scratch: Path) -> None:
    """The worker: import Quark at once, then quantize the one folder it is asked to."""
    started = process_started() or time.perf_counter()
    report: WorkerReport = {"timings": {}}
    try:
        import_quark()
        report["timings"]["quark_import"] = round(time.perf_counter() - started, 3)
        line = sys.stdin.readline()
        if not line:
            return  # the export ended before it needed Quark
        _quantize(scratch, json.loads(line), report["timings"])
    except Exception as exc:
        report["error"] = type(exc).__name__
        report["message"] = str(exc).strip().split("\n")[0]
        report["io"] = type(exc).__name__ == "SafetensorError"
    (scratch / REPORT).write_text(json.dumps(report))


def _quantize(scratch: Path, request: dict[str, Any], timings: dict[str, float]) -> None:
    # lazy: Quark's slow import
    from quark.torch import ModelQuantizer

    recipe = recipe_from_dict(request["recipe"], "the export's recipe")
    started = time.perf_counter()
    ModelQuantizer(quark_config(recipe)).direct_quantize_checkpoint(
        str(scratch / SOURCE), str(scratch / RESULT), device="cpu"
    )
    timings["quark_file_to_file"] = round(time.perf_counter() - started, 3)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    # The report is written: skip the interpreter's teardown of torch and Quark (about 2 s of
    # one core on a 2-core EPYC), which the export would wait for.
    exit_at_once()
