"""Where `tune --predict` errs, from a recorded run and full grid (offline: nothing is served).

Reads a folder such as ``bench/results-tune-smollm2/grid-5ccb4a8`` (``predicted/results.json``:
the ``--predict`` run's no-speculation and largest-k servers; ``predict.json``: every point's
prediction against the full grid's rounds; ``full/k*.json``: each k's own acceptance counters)
and prints:

1. every point predicted three ways: as ``--predict`` does (``predicted_length`` from the
   largest k's counters), with each k's own measured acceptance instead, and the grid;
2. the split of a speculative step into the target's ``T(c (k + 1))``, a fixed cost ``F`` and
   ``k`` draft steps ``D``, solved from each k's grid server against the largest k (one
   speculative server cannot separate ``F`` from ``D``; two can);
3. with ``--confirm K:C:TOK_S:LENGTH`` (a second speculative server's k, concurrency,
   throughput and acceptance length, e.g. tune's confirmation), every k at C refitted on it
   and the largest k;
4. acceptance lengths at smaller k from a larger k's counters: the plain sum, tune's
   ``predicted_length`` and a two-regime hidden-Markov fit, against each k's own.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path
from statistics import fmean

import numpy as np

from eaglequant.tune.predict import Point, StepModel, expected_length, fit, predicted_length


def load(folder: Path) -> dict:  # type: ignore[type-arg]
    served = json.loads((folder / "predicted" / "results.json").read_text())["results"]
    grid = json.loads((folder / "predict.json").read_text())["points"]
    own = {}
    for path in sorted((folder / "full").glob("k[1-9]*.json")):
        first = json.loads(path.read_text())[0]
        own[first["k"]] = (first["acceptance_length"], tuple(first["per_position"]))
    fitted = [  # the --predict run's own servers: no speculation and the largest k
        Point(r["k"], r["concurrency"], tuple(r["runs"]), tuple(r["per_position"]))
        for r in served
        if not r.get("schedule")
    ]
    rounds = {(p["k"], p["concurrency"]): p["full_grid_rounds"] for p in grid}
    return {"model": fit(fitted), "rounds": rounds, "own": own}


def against_grid(run: dict, k: int, c: int, step: float) -> tuple[float, float, float]:  # type: ignore[type-arg]
    """At (k, c) with a step of ``step`` seconds: the grid's mean, the throughput with
    ``predicted_length`` from the largest k's counters, and with k's own acceptance."""
    model = run["model"]
    grid = fmean(run["rounds"][(k, c)])
    tune = c * predicted_length(model.per_position[c], k) / step
    return grid, tune, c * run["own"][k][0] / step


def predictions(run: dict) -> None:  # type: ignore[type-arg]
    model, own = run["model"], run["own"]
    print("k  conc  grid mean [rounds]        --predict   with own acceptance")
    for c in sorted(model.draft_step):
        for k in sorted(k for k in own if k < model.k_max):
            step = model.target(c * (k + 1)) + k * model.draft_step[c]
            grid, tune, exact = against_grid(run, k, c, step)
            rounds = run["rounds"][(k, c)]
            print(
                f"{k:<2} {c:>4}  {grid:7.1f} [{min(rounds):.1f}-{max(rounds):.1f}]"
                f"  {tune:7.1f} ({tune / grid - 1:+.1%})  {exact:7.1f} ({exact / grid - 1:+.1%})"
            )


def split(run: dict) -> None:  # type: ignore[type-arg]
    """F and D per concurrency from each k's grid server and the largest k."""
    model, own = run["model"], run["own"]
    print(
        f"\nF (fixed, ms) and D (per draft step, ms) from each k's grid server and k={model.k_max}"
    )
    for c in sorted(model.draft_step):
        parts = []
        for k in sorted(k for k in own if k < model.k_max):
            step = c * own[k][0] / fmean(run["rounds"][(k, c)])
            fixed, draft = solve(model, c, k, step)
            parts.append(f"k={k}: F {fixed * 1e3:.1f} D {draft * 1e3:.2f}")
        print(f"  concurrency {c}: " + "; ".join(parts))


def solve(model: StepModel, c: int, k: int, step: float) -> tuple[float, float]:
    """``F`` and ``D`` at concurrency ``c`` from a step of ``step`` seconds at ``k`` and the
    largest k's."""
    rest = step - model.target(c * (k + 1))
    draft = (model.k_max * model.draft_step[c] - rest) / (model.k_max - k)
    return rest - k * draft, draft


def refit(run: dict, confirm: str) -> None:  # type: ignore[type-arg]
    model = run["model"]
    k_c, c, tok_s, length = confirm.split(":")
    k1, conc = int(k_c), int(c)
    fixed, draft = solve(model, conc, k1, conc * float(length) / float(tok_s))
    print(
        f"\nrefit at concurrency {conc} on k={k1} and k={model.k_max}: F {fixed * 1e3:.2f} ms, "
        f"D {draft * 1e3:.2f} ms"
    )
    for k in sorted(k for k in run["own"] if k not in (k1, model.k_max)):
        cost = model.target(conc * (k + 1)) + fixed + k * draft
        grid, tune, exact = against_grid(run, k, conc, cost)
        print(
            f"  k={k}: grid {grid:.1f}, predicted_length {tune:.1f} ({tune / grid - 1:+.1%}), "
            f"own acceptance {exact:.1f} ({exact / grid - 1:+.1%})"
        )


def markov_length(params: np.ndarray, k: int) -> tuple[float, np.ndarray]:
    """Tokens per step at k and acceptance by position, for positions the draft gets right in
    two persistent regimes: right with probability ``params[0]`` or ``[1]``, switching from
    the first to the second with ``[2]`` per position and back with ``[3]``. A step's start
    regime follows the last one's (after a rejection one position on, after a full step two:
    the bonus token is the target's)."""
    right, (to_second, to_first) = params[:2], params[2:]
    move = np.array([[1 - to_second, to_second], [to_first, 1 - to_first]])
    kernel, tokens, by_position = np.zeros((2, 2)), np.zeros(2), np.zeros((2, k))
    for start in range(2):
        alive = np.eye(2)[start]
        for depth in range(1, k + 1):
            if depth > 1:
                alive = alive @ move
            rejected = alive * (1 - right)
            kernel[start] += rejected @ move
            tokens[start] += depth * rejected.sum()
            alive = alive * right
            by_position[start, depth - 1] = alive.sum()
        kernel[start] += alive @ move @ move
        tokens[start] += (k + 1) * alive.sum()
    values, vectors = np.linalg.eig(kernel.T)
    share = np.real(vectors[:, np.argmin(abs(values - 1))])
    share = share / share.sum()
    return float(share @ tokens), share @ by_position


def markov_fit(per_position: tuple[float, ...]) -> np.ndarray:
    """The four parameters whose acceptance by position is closest to ``per_position``: a
    grid search, then three finer grids around the best."""
    target, k = np.array(per_position), len(per_position)
    centre, width = np.full(4, 0.5), 0.48
    for _ in range(4):
        axes = [np.clip(np.linspace(x - width, x + width, 9), 1e-3, 1 - 1e-3) for x in centre]
        best = min(
            itertools.product(*axes),
            key=lambda p: float(np.sum((markov_length(np.array(p), k)[1] - target) ** 2)),
        )
        centre, width = np.array(best), width / 4
    return centre


def lengths(run: dict) -> None:  # type: ignore[type-arg]
    own = run["own"]
    print("\nacceptance length at k from a larger K's counters (error against k's own)")
    for top in sorted((k for k in own if k > 2), reverse=True):
        per_position = own[top][1]
        params = markov_fit(per_position)
        for k in sorted(k for k in own if k < top):
            true, plain = own[k][0], expected_length(per_position, k)
            chain, markov = predicted_length(per_position, k), markov_length(params, k)[0]
            print(
                f"  K={top} k={k}: own {true:.3f}, plain {plain / true - 1:+.1%}, "
                f"predicted_length {chain / true - 1:+.1%}, two regimes {markov / true - 1:+.1%}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "folder", type=Path, help="a recorded grid (predicted/, predict.json, full/)"
    )
    parser.add_argument(
        "--confirm", help="K:CONCURRENCY:TOK_S:ACCEPTANCE_LENGTH of a second server"
    )
    args = parser.parse_args()
    run = load(args.folder)
    predictions(run)
    split(run)
    if args.confirm:
        refit(run, args.confirm)
    lengths(run)


if __name__ == "__main__":
    main()
