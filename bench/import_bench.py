"""Import benchmark: the heavy imports eaglequant pays for, with the garbage collector running,
paused, and paused then frozen (``eaglequant.interpreter.collection_paused``).

Each import runs in a fresh interpreter, the three ways taking turns at going first,
``--runs`` times each: torch with transformers (the export's own imports), ``quark.torch`` as
the export imports it (quiet, its expert-class scan skipped; torch is imported before the
measured part either way), the same with Quark's level set by ``QUARK_LOG_LEVEL`` (how the
export quieted it before) and vLLM's offline entry point (what every engine child imports).
The ways: "collected" (the collector runs throughout), "paused" (off for the import, then on
again), "frozen" (off for the import, then what it left alive frozen out of later
collections: what eaglequant does). After the import each run makes 200,000 small objects,
as the work that follows an import does, and times that too: with the collector back on,
its first collections walk everything the import left alive.

Recorded per import and way: each run's wall time of the import itself, of the 200,000
objects after it, and the CPU time of the whole process (user + system); and the ratios of
the medians of import + after to "collected"'s.

    python bench/import_bench.py [--runs 3] [--out bench/results-imports.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from statistics import median

from eaglequant.results.environment import cpu_info

HERE = Path(__file__).resolve().parent

QUARK_SETUP = (
    "from eaglequant.quantize.quark_backend import experts_scan_skipped, quiet_quark\n"
    "quiet_quark()\n"
)
# name -> (set-up outside the measurement, the import measured)
IMPORTS = {
    "torch+transformers": ("", "import torch, transformers"),
    "quark.torch": (QUARK_SETUP, "with experts_scan_skipped():\n    import quark.torch"),
    "quark.torch (QUARK_LOG_LEVEL)": (
        "import os\nos.environ['QUARK_LOG_LEVEL'] = 'warning'\n" + QUARK_SETUP,
        "with experts_scan_skipped():\n    import quark.torch",
    ),
    "vllm.entrypoints.llm": ("", "import vllm.entrypoints.llm"),
}
SCRIPT = """\
import contextlib, gc, resource, sys, time
from eaglequant.interpreter import collection_paused
{setup}

@contextlib.contextmanager
def paused():
    gc.disable()
    try:
        yield
    finally:
        gc.enable()

way = {{"collected": contextlib.nullcontext, "paused": paused, "frozen": collection_paused}}
started = time.perf_counter()
with way[sys.argv[1]]():
{body}
imported = time.perf_counter()
made = [[index] for index in range(200_000)]
after = time.perf_counter()
usage = resource.getrusage(resource.RUSAGE_SELF)
print(imported - started, after - imported, usage.ru_utime + usage.ru_stime)
"""
WAYS = ("collected", "paused", "frozen")


def measure(name: str, way: str) -> dict[str, float]:
    setup, statement = IMPORTS[name]
    body = "\n".join(f"    {line}" for line in statement.splitlines())
    script = SCRIPT.format(setup=setup, body=body)
    done = subprocess.run(
        [sys.executable, "-c", script, way], capture_output=True, text=True, check=True
    )
    seconds, after, cpu = (float(v) for v in done.stdout.split()[-3:])
    return {
        "import_s": round(seconds, 3),
        "after_s": round(after, 3),
        "process_cpu_s": round(cpu, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=HERE / "results-imports.json")
    args = parser.parse_args()
    results: dict[str, dict[str, object]] = {}
    for name in IMPORTS:
        runs: dict[str, list[dict[str, float]]] = {way: [] for way in WAYS}
        for index in range(args.runs):
            for way in WAYS[index % 3 :] + WAYS[: index % 3]:
                runs[way].append(measure(name, way))
        total = {way: median(r["import_s"] + r["after_s"] for r in runs[way]) for way in WAYS}
        ratios = {way: round(total[way] / total["collected"], 3) for way in WAYS[1:]}
        results[name] = {**runs, "total_over_collected": ratios}
        line = "  ".join(
            f"{way} {median(r['import_s'] for r in runs[way]):.2f}s"
            f" + {median(r['after_s'] for r in runs[way]):.2f}s"
            f" ({median(r['process_cpu_s'] for r in runs[way]):.1f} CPU s)"
            for way in WAYS
        )
        print(f"{name:30} {line}", flush=True)
    record = {"cpu": cpu_info()["model"], "cpus": os.cpu_count(), "runs": args.runs}
    record["imports"] = results
    args.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
