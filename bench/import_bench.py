"""Import benchmark: the heavy imports eaglequant pays for, with and without the garbage
collector paused (``eaglequant.interpreter.collection_paused``).

Each import runs in a fresh interpreter, the two ways taking turns at going first, ``--runs``
times each: torch with transformers (the export's own imports), ``quark.torch`` as the
export imports it (quiet, its expert-class scan skipped; torch is imported before the
measured part either way) and vLLM's offline entry point (what every engine child imports).
Recorded per import and way: each run's wall time of the import itself and the CPU time of
the whole process (user + system), and the ratio of the medians.

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

# name -> (set-up outside the measurement, the import measured)
IMPORTS = {
    "torch+transformers": ("", "import torch, transformers"),
    "quark.torch": (
        "from eaglequant.quantize.quark_backend import experts_scan_skipped, quiet_quark\n"
        "quiet_quark()\n",
        "with experts_scan_skipped():\n    import quark.torch",
    ),
    "vllm.entrypoints.llm": ("", "import vllm.entrypoints.llm"),
}
SCRIPT = """\
import contextlib, resource, sys, time
from eaglequant.interpreter import collection_paused
{setup}
started = time.perf_counter()
with collection_paused() if sys.argv[1] == "paused" else contextlib.nullcontext():
{body}
seconds = time.perf_counter() - started
usage = resource.getrusage(resource.RUSAGE_SELF)
print(seconds, usage.ru_utime + usage.ru_stime)
"""


def measure(name: str, way: str) -> dict[str, float]:
    setup, statement = IMPORTS[name]
    body = "\n".join(f"    {line}" for line in statement.splitlines())
    script = SCRIPT.format(setup=setup, body=body)
    done = subprocess.run(
        [sys.executable, "-c", script, way], capture_output=True, text=True, check=True
    )
    seconds, cpu = (float(v) for v in done.stdout.split()[-2:])
    return {"import_s": round(seconds, 3), "process_cpu_s": round(cpu, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=HERE / "results-imports.json")
    args = parser.parse_args()
    results: dict[str, dict[str, object]] = {}
    for name in IMPORTS:
        runs: dict[str, list[dict[str, float]]] = {"collected": [], "paused": []}
        for index in range(args.runs):
            for way in sorted(runs, reverse=index % 2 == 1):
                runs[way].append(measure(name, way))
        medians = {way: median(r["import_s"] for r in found) for way, found in runs.items()}
        ratio = round(medians["paused"] / medians["collected"], 3)
        results[name] = {**runs, "paused_over_collected": ratio}
        print(
            f"{name:22} collected {medians['collected']:.2f}s  paused {medians['paused']:.2f}s"
            f"  ({ratio:.2f}x)",
            flush=True,
        )
    record = {"cpu": cpu_info()["model"], "cpus": os.cpu_count(), "runs": args.runs}
    record["imports"] = results
    args.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
