"""One engine command end to end, this checkout against another, side by side.

``eaglequant acceptance`` (one vLLM engine child: vLLM imported, the engine started, the
prompts generated with speculation, its counters read) is run ``--runs`` times with this
checkout and with ``--before CHECKOUT`` (the previous version, e.g. a ``git worktree``),
the two taking turns at going first, with the same interpreter and venv. Recorded per run:
the wall time and the CPU time (user + system) of the command and every process it waited
for, and whether both versions measured the same mean acceptance length.

    python bench/engine_command_bench.py TARGET DRAFT --before CHECKOUT [--runs 3] \
        [--prompts mt-bench:8] [--max-tokens 32] [--out bench/results-engine-command.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

from export_bench import checkout_env  # a sibling module: bench/ is on the path

from eaglequant.results.environment import cpu_info

HERE = Path(__file__).resolve().parent
SIDES = ("this version", "previous version")


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_command(
    args: argparse.Namespace, env: dict[str, str] | None, out: Path
) -> dict[str, float]:
    command = [sys.executable, "-m", "eaglequant.cli", "acceptance"]
    command += ["--target", str(args.target), "--draft", str(args.draft)]
    command += ["--prompts", args.prompts, "--max-tokens", str(args.max_tokens)]
    command += ["--json", str(out)]
    cpu, started = children_cpu(), time.perf_counter()
    subprocess.run(command, env=env, check=True, capture_output=True)
    wall = time.perf_counter() - started
    length = json.loads(out.read_text())["mean_length"]["point"]
    return {"wall_s": round(wall, 3), "cpu_s": round(children_cpu() - cpu, 3), "length": length}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", type=Path)
    parser.add_argument("draft", type=Path)
    parser.add_argument("--before", type=Path, required=True, help="the other checkout")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--prompts", default="mt-bench:8")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, default=HERE / "results-engine-command.json")
    args = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
    with tempfile.TemporaryDirectory(prefix="eaglequant-engine-bench-") as scratch:
        envs = {SIDES[0]: None, SIDES[1]: checkout_env(args.before, Path(scratch))}
        for index in range(args.runs):
            for side in SIDES[::-1] if index % 2 else SIDES:
                found = run_command(args, envs[side], Path(scratch) / "acceptance.json")
                runs[side].append(found)
                print(
                    f"run {index + 1}, {side}: {found['wall_s']:.1f} s, {found['cpu_s']:.1f} CPU s",
                    flush=True,
                )
    lengths = {run["length"] for side in SIDES for run in runs[side]}
    walls = {side: median(run["wall_s"] for run in runs[side]) for side in SIDES}
    ratio = round(walls[SIDES[0]] / walls[SIDES[1]], 3)
    print(f"median wall: this version / previous version = {ratio}; lengths {sorted(lengths)}")
    record = {
        "cpu": cpu_info()["model"],
        "cpus": os.cpu_count(),
        "command": f"eaglequant acceptance --prompts {args.prompts} --max-tokens {args.max_tokens}",
        "runs": runs,
        "first": [SIDES[index % 2] for index in range(args.runs)],
        "same_length": len(lengths) == 1,
        "median_wall_ratio": ratio,
    }
    args.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
