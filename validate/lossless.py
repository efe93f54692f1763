"""Check 1, lossless: speculative decoding must not change the target's greedy output.

vLLM verifies every drafted token against the target, so target + draft must
generate what the target alone generates. On CPU vLLM's greedy outputs are
exactly reproducible, and they are compared exactly. On GPU/ROCm vLLM's
kernels are not batch-invariant: a speculative run scores tokens in other
batch shapes than the target alone, so where the target's two best tokens are
nearly tied the argmax may flip, and the two runs diverge from there on,
legitimately (tensor parallelism changes the order of BF16 sums the same
way). The ``near-tie`` mode (the default) therefore takes the target run's
top-5 logprobs at the first position where a speculative run differs and
passes that divergence only when the run chose a token the target ranked
within ``tie_margin`` nats of its best (default 0.1: about two BF16 rounding
steps of a logit of magnitude 16-32, the size of the batch-shape noise; in
BF16 three or more tokens can tie exactly, measured on the toy target at
TP=2). Any other divergence fails. ``strict`` requires equality.

Scored teacher-forced (the default path: each run's output scored by a prefill
of its own engine), the ``paired`` mode (the default) measures the noise
instead of bounding it. On a real target the verify pass and the prefill break
BF16 near-ties differently by up to 0.75 nats (SmolLM2-135M, docs/known-issues.md),
at the same positions whichever draft runs. A draft cannot cause that: vLLM
accepts a drafted token only when it is the verify pass's argmax. So the
reference draft's run (the BF16 draft, lossless by construction) is the
control: each of its flips is recorded as the engine's noise, and a
candidate's flip passes when the reference generated the same prefix and the
same token there (it made the same choice in the same context). A candidate
flip the reference does not share is judged as ``near-tie`` judges it, so an
FP8 setting that reached the target (its KV cache, say) still fails.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from eaglequant.results.validation_report import Check, CheckId

MODES = ("paired", "near-tie", "strict")
DEFAULT_MODE = "paired"  # "near-tie" where there is no reference run to pair with
DEFAULT_TIE_MARGIN = 0.1
# Teacher-forced scores are the target's raw BF16 logits (the engine child asks vLLM for
# ``logprobs_mode="raw_logits"``), so each near-tie is also measured in rounding steps of the
# best logit's own size, and may be judged in them (``tie_steps``; 0: not). Off by default:
# on SmolLM2-135M most prefill-against-decode flips were 1-2 steps, but one was 10 (0.156 at a
# logit of 2-4): the noise follows the hidden state, not the logit's size (docs/known-issues.md).
DEFAULT_TIE_STEPS = 0.0
# Paired mode judges a candidate's flips that the control's run does not share as one
# population against the control's: the engine's noise makes as many flips in either run (the
# target is the same; a draft cannot change what the verify pass accepts), so a candidate with
# significantly more flips above the tie margin than its control (one-sided binomial test over
# the flips of both, at FLIP_EXCESS_ALPHA) fails, each of them named. A flip of more than
# NOISE_CEILING nats is no tie in any run, the control's included.
FLIP_EXCESS_ALPHA = 0.001
NOISE_CEILING = 1.0
# After a candidate's run its engine scores the control's tokens again: the target must score
# them as the control's engine did, up to this many BF16 rounding steps of each score (a
# prefill of the same batch is deterministic; an FP8 KV cache that reached the target is not).
IDENTITY_STEPS = 1.0
RAW_LOGITS = "raw_logits"  # the engine result's teacher_forced_scores when they are logits
BF16_MANTISSA_BITS = 7
TOP_LOGPROBS = 5
# Teacher-forced scoring (EngineRequest.teacher_forced): the target's best tokens asked at every
# generated position, besides the generated one (vLLM adds it): two give the top-2 margin.
TEACHER_FORCED_RANKS = 2

TopLogprobs = Sequence[Sequence[Sequence[float]]]  # position -> rank -> (token, logprob)


@dataclass(frozen=True)
class Divergence:
    """Where one speculative run first left the target's own greedy output, and the verdict."""

    draft: str
    prompt: int
    position: int
    target_token: int | None
    draft_token: int | None
    margin: float | None  # target's best logprob minus the chosen token's
    verdict: str  # "tie", "paired" or "noise" (allowed), or "fail"
    ranked: bool = True  # the target run recorded its top logprobs there
    steps: float | None = None  # the margin in BF16 rounding steps of the best raw logit
    # the control (paired mode's reference run) generated the same prefix and token there
    shared: bool | None = None


def first_difference(reference: Sequence[int], got: Sequence[int]) -> int | None:
    """The first position where the two token lists differ (length included), or None."""
    for position, (a, b) in enumerate(zip(reference, got, strict=False)):
        if a != b:
            return position
    return None if len(reference) == len(got) else min(len(reference), len(got))


def judge(
    draft: str,
    prompt: int,
    reference: Sequence[int],
    got: Sequence[int],
    top: TopLogprobs | None,
    mode: str,
    tie_margin: float,
) -> Divergence | None:
    """The divergence of one prompt's run from the target alone, or None when equal."""
    position = first_difference(reference, got)
    if position is None:
        return None
    target_token = reference[position] if position < len(reference) else None
    draft_token = got[position] if position < len(got) else None
    ranked = top[position] if top is not None and position < len(top) else None
    margin = _margin(ranked, draft_token)
    verdict = _verdict(margin, mode, tie_margin)
    return Divergence(
        draft, prompt, position, target_token, draft_token, margin, verdict, ranked is not None
    )


def _verdict(margin: float | None, mode: str, tie_margin: float) -> str:
    """A token other than the target's best: "tie" within the tie margin (near-tie, or paired
    where no reference run made the same choice)."""
    tolerant = mode in ("near-tie", "paired")
    return "tie" if tolerant and margin is not None and margin <= tie_margin else "fail"


def _nth(outputs: Sequence[Sequence[int]], prompt: int) -> Sequence[int] | None:
    return outputs[prompt] if prompt < len(outputs) else None


def _shared(reference: Sequence[int] | None, tokens: Sequence[int], position: int) -> bool:
    """Whether the reference run generated ``tokens`` up to and including ``position``."""
    return reference is not None and list(reference[: position + 1]) == list(tokens[: position + 1])


def _margin(ranked: Sequence[Sequence[float]] | None, chosen: int | None) -> float | None:
    """How far below the target's best logprob the chosen token's was (0: tied for best; None:
    not among the ranked). Searched at every rank: vLLM ranks exactly tied tokens alike, so
    the chosen one may come first in the list however the tie was broken."""
    if not ranked or chosen is None:
        return None
    best = max(float(logprob) for _, logprob in ranked)
    found = [float(logprob) for token, logprob in ranked if int(token) == chosen]
    return best - found[0] if found else None


def lossless_check(
    reference: Sequence[Sequence[int]],
    top: Sequence[TopLogprobs | None] | None,
    runs: dict[str, Sequence[Sequence[int]]],
    mode: str = DEFAULT_MODE,
    tie_margin: float = DEFAULT_TIE_MARGIN,
) -> Check:
    """Check 1 over every prompt of every speculative run (``runs``: draft -> token ids)."""
    divergences: list[Divergence] = []
    for draft, outputs in runs.items():
        if len(outputs) != len(reference):
            divergences.append(Divergence(draft, -1, -1, None, None, None, "fail"))
            continue
        for prompt, (want, got) in enumerate(zip(reference, outputs, strict=True)):
            found = judge(draft, prompt, want, got, top[prompt] if top else None, mode, tie_margin)
            if found is not None:
                divergences.append(found)
    failed = [d for d in divergences if d.verdict == "fail"]
    numbers: dict[str, Any] = {
        "mode": mode,
        "tie_margin": tie_margin,
        "divergences": [asdict(d) for d in divergences],
    }
    return Check(CheckId.LOSSLESS, not failed, _detail(divergences, failed, mode), numbers)


def teacher_forced_check(
    runs: Mapping[str, tuple[Sequence[Sequence[int]], Sequence[TopLogprobs | None]]],
    mode: str = DEFAULT_MODE,
    tie_margin: float = DEFAULT_TIE_MARGIN,
    tie_steps: float | None = None,
    reference: str | None = None,
    rescored: Mapping[str, Sequence[TopLogprobs | None]] | None = None,
) -> Check:
    """Check 1 from teacher-forced scores (``runs``: draft -> (token ids, scores per prompt)):
    every generated token must be the target's argmax given its own prefix, scored by the
    same engine's prefill; by induction on the position the output is then the target's
    greedy output. Each position is judged on its own (no cascade after a near-tie flip);
    A token tied exactly with the best is a greedy choice in both modes; beyond that
    ``near-tie`` passes a token within ``tie_margin`` nats of the best, or, when the scores
    are raw BF16 logits (``tie_steps`` given), within ``tie_steps`` rounding steps of the
    best logit; ``strict`` passes none. ``paired`` (with ``reference``, the run that is the
    control) records the reference's own flips as the engine's noise and passes a
    candidate's flip that the reference made too; other flips as ``near-tie``.
    A run without a score at some generated position fails: nothing observed passes nothing.
    ``rescored`` (draft -> scores): the reference's tokens scored again in that draft's engine
    after its run; they must equal the reference's own scores (:func:`same_target`), else the
    draft's run was served by another target (something of the draft's reached it).
    """
    control = runs.get(reference) if mode == "paired" and reference else None
    if mode == "paired" and control is None:
        mode = "near-tie"  # no run to pair with
    divergences: list[Divergence] = []
    closest: dict[str, float | None] = {}
    positions = 0
    by_draft: dict[str, int] = {}
    for draft, (outputs, scores) in runs.items():
        closest[draft] = None
        by_draft[draft] = sum(len(tokens) for tokens in outputs)
        if len(scores) != len(outputs):
            divergences.append(Divergence(draft, -1, -1, None, None, None, "fail"))
            continue
        for prompt, (tokens, scored) in enumerate(zip(outputs, scores, strict=True)):
            if scored is None or len(scored) != len(tokens):
                divergences.append(Divergence(draft, prompt, 0, None, None, None, "fail", False))
                continue
            for position, (token, ranked) in enumerate(zip(tokens, scored, strict=True)):
                positions += 1
                gap, seen = _top2_gap(ranked), closest[draft]
                if gap is not None and (seen is None or gap < seen):
                    closest[draft] = gap
                margin = _margin(ranked, token)
                if margin is not None and margin <= 0.0:
                    continue  # the best, or tied exactly with it: a greedy choice either way
                best = int(ranked[0][0]) if ranked else None
                steps = _steps(ranked, margin) if tie_steps is not None else None
                shared = control is not None and _shared(_nth(control[0], prompt), tokens, position)
                divergences.append(
                    Divergence(
                        draft, prompt, position, best, token, margin, "", True, steps, shared
                    )
                )
    numbers: dict[str, Any] = {
        "mode": mode,
        "paired_with": reference if control is not None else None,
        "tie_margin": tie_margin,
        "tie_steps": tie_steps,
        "scores": RAW_LOGITS if tie_steps is not None else "logprobs",
        "reference": "teacher-forced",
        "positions": positions,
        "positions_by_draft": by_draft,
        "smallest_top2_margin": closest,
        "target_identity": {  # in every mode: the reference run's tokens, scored again
            draft: asdict(same_target(runs[reference][1], scores))
            for draft, scores in (rescored or {}).items()
            if reference is not None and reference in runs and draft != reference
        },
    }
    return judge_flips(divergences, numbers)


def judge_flips(divergences: Sequence[Divergence], numbers: dict[str, Any]) -> Check:
    """Check 1's verdict on the teacher-forced flips (``divergences``) of every run, by the
    mode, margin and control that ``numbers`` records (see :func:`teacher_forced_check`)."""
    mode, tie_margin, tie_steps = numbers["mode"], numbers["tie_margin"], numbers["tie_steps"]
    reference = numbers.get("paired_with")
    judged = [
        d
        if _unscored(d)
        else replace(d, verdict=_flip_verdict(d, mode, tie_margin, tie_steps, reference))
        for d in divergences
    ]
    populations: dict[str, FlipPopulation] = {}
    if mode == "paired" and reference is not None:
        judged, populations = _against_control(judged, reference, _positions(numbers, judged))
    failed = [d for d in judged if d.verdict == "fail"]
    noise = [d.margin for d in judged if d.verdict == "noise" and d.margin is not None]
    recorded = numbers.get("target_identity") or {}
    identities = {draft: TargetIdentity(**seen) for draft, seen in recorded.items()}
    others = {draft: seen for draft, seen in identities.items() if not seen.same}
    numbers = {
        **numbers,
        "reference_noise": {"flips": len(noise), "largest_margin": max(noise, default=None)},
        "noise_ceiling": NOISE_CEILING,
        "flip_populations": {draft: asdict(p) for draft, p in populations.items()},
        "divergences": [asdict(d) for d in judged],
    }
    if not failed and numbers["positions"] == 0:
        return Check(CheckId.LOSSLESS, False, "no generated token was scored", numbers)
    detail = _forced_detail(judged, failed, mode, populations)
    if others:
        detail = f"{_other_targets(others, reference)}; {detail}"
    return Check(CheckId.LOSSLESS, not failed and not others, detail, numbers)


@dataclass(frozen=True)
class TargetIdentity:
    """The reference run's tokens as another draft's engine scored them, against the
    reference's own scores: positions compared, how many differ beyond IDENTITY_STEPS, and
    the largest difference (nats, and BF16 steps of the score)."""

    positions: int
    differing: int
    largest: float
    largest_steps: float

    @property
    def same(self) -> bool:
        return self.positions > 0 and self.differing == 0


def same_target(
    own: Sequence[TopLogprobs | None], again: Sequence[TopLogprobs | None]
) -> TargetIdentity:
    """Compare two scorings of the same tokens, position by position, on every token both
    ranked; a missing or mismatched scoring counts its positions as differing."""
    positions = differing = 0
    largest = largest_steps = 0.0
    for first, second in zip(own, again, strict=False):
        if first is None or second is None or len(first) != len(second):
            count = len(first or second or [])
            positions, differing = positions + count, differing + max(count, 1)
            continue
        for ranked, reranked in zip(first, second, strict=True):
            positions += 1
            scores = {int(token): float(score) for token, score in reranked}
            worst = 0.0
            for token, score in ranked:
                if int(token) not in scores:
                    worst = math.inf
                    continue
                delta = abs(float(score) - scores[int(token)])
                step = bf16_step(max(abs(float(score)), abs(scores[int(token)])))
                steps = delta / step if step else (math.inf if delta else 0.0)
                largest, worst = max(largest, delta), max(worst, steps)
            largest_steps = max(largest_steps, worst if math.isfinite(worst) else largest_steps)
            differing += worst > IDENTITY_STEPS
    if len(own) != len(again):
        differing += abs(len(own) - len(again))
    return TargetIdentity(positions, differing, largest, largest_steps)


def _other_targets(others: Mapping[str, TargetIdentity], reference: str | None) -> str:
    return "; ".join(
        f"{draft}'s engine scored the {reference} run's tokens otherwise than the {reference} "
        f"engine at {seen.differing} of {seen.positions} positions (up to {seen.largest:.3g} "
        f"nats, {seen.largest_steps:.3g} BF16 steps): its target is not the same (something "
        "of the draft's reached it, e.g. an FP8 KV cache)"
        for draft, seen in others.items()
    )


@dataclass(frozen=True)
class FlipPopulation:
    """One candidate run's flips above the tie margin against its control's, over the
    positions each scored, and whether the candidate's count is within the engine's noise."""

    flips: int
    control_flips: int
    positions: int
    control_positions: int
    p_value: float  # P(as many candidate flips or more | both counts' sum, equal rates)
    excess: bool  # p_value < FLIP_EXCESS_ALPHA


def _positions(numbers: Mapping[str, Any], judged: Sequence[Divergence]) -> dict[str, int]:
    """Scored positions per run (recorded since they are; before, the total split evenly)."""
    recorded = numbers.get("positions_by_draft")
    if recorded:
        return dict(recorded)
    drafts = {d.draft for d in judged}
    if numbers.get("paired_with") is not None:
        drafts.add(str(numbers["paired_with"]))
    return {draft: numbers["positions"] // max(len(drafts), 1) for draft in drafts}


def _against_control(
    judged: list[Divergence], reference: str, positions: Mapping[str, int]
) -> tuple[list[Divergence], dict[str, FlipPopulation]]:
    """Paired mode's population step: each candidate's flips the control does not share
    ("fail" so far, within the noise ceiling) are "unpaired" when the candidate's count of
    flips above the tie margin is within the control's (a one-sided binomial test), else
    they stay "fail"."""
    above = ("noise", "paired", "fail", "unpaired")
    control = sum(d.draft == reference and d.verdict in above for d in judged)
    populations: dict[str, FlipPopulation] = {}
    for draft in sorted({d.draft for d in judged} - {reference}):
        flips = sum(d.draft == draft and d.verdict in above and not _unscored(d) for d in judged)
        mine, theirs = positions.get(draft, 0), positions.get(reference, 0)
        share = mine / (mine + theirs) if mine + theirs else 0.5
        p_value = binomial_tail(flips, flips + control, share)
        populations[draft] = FlipPopulation(
            flips, control, mine, theirs, p_value, p_value < FLIP_EXCESS_ALPHA
        )
    unpaired = [
        replace(d, verdict="unpaired")
        if d.verdict == "fail"
        and not _unscored(d)
        and d.draft in populations
        and not populations[d.draft].excess
        and d.margin is not None
        and d.margin <= NOISE_CEILING
        else d
        for d in judged
    ]
    return unpaired, populations


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p)."""
    if k <= 0:
        return 1.0
    return min(1.0, sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1)))


def _unscored(d: Divergence) -> bool:
    """A run without outputs or scores to judge (always a failure)."""
    return d.prompt < 0 or not d.ranked


def _flip_verdict(
    d: Divergence, mode: str, tie_margin: float, tie_steps: float | None, reference: str | None
) -> str:
    """One teacher-forced flip's verdict: "tie", "noise" (the control's own), "paired" (the
    control's run made it too) or "fail" (paired mode may then call it "unpaired")."""
    verdict = _verdict(d.margin, mode, tie_margin)
    if verdict == "fail" and mode != "strict" and d.steps is not None and tie_steps:
        verdict = "tie" if d.steps <= tie_steps else "fail"
    beyond = d.margin is None or d.margin > NOISE_CEILING
    if verdict == "fail" and mode == "paired" and reference is not None and not beyond:
        if d.draft == reference:
            verdict = "noise"
        elif d.shared:
            verdict = "paired"
    return verdict


def rejudge(numbers: Mapping[str, Any]) -> Check:
    """Check 1 judged again, by the rule installed now, from a teacher-forced check's recorded
    ``numbers`` (a report's): the same flips, margins and controls (a flip recorded before
    ``shared`` was recorded is shared when it was judged "paired")."""
    fields_ = set(Divergence.__dataclass_fields__)
    flips = []
    for raw in numbers["divergences"]:
        kept = {k: v for k, v in raw.items() if k in fields_}
        if kept.get("shared") is None:
            kept["shared"] = raw.get("verdict") == "paired"
        flips.append(Divergence(**kept))
    derived = ("divergences", "reference_noise", "noise_ceiling", "flip_populations")
    kept_numbers = {k: v for k, v in numbers.items() if k not in derived}
    return judge_flips(flips, kept_numbers)


def bf16_step(value: float) -> float:
    """The spacing of BF16 values around ``value`` (0 for 0)."""
    if value == 0.0 or not math.isfinite(value):
        return 0.0
    return 2.0 ** (math.floor(math.log2(abs(value))) - BF16_MANTISSA_BITS)


def _steps(ranked: Sequence[Sequence[float]] | None, margin: float | None) -> float | None:
    """``margin`` in rounding steps of the best raw logit (None: no margin, or a zero step)."""
    if not ranked or margin is None:
        return None
    step = bf16_step(max(float(score) for _, score in ranked))
    return margin / step if step else None


def _top2_gap(ranked: Sequence[Sequence[float]]) -> float | None:
    """The target's best logprob minus its second best at one position (None: one ranked)."""
    values = sorted((float(lp) for _, lp in ranked), reverse=True)
    return values[0] - values[1] if len(values) > 1 else None


def _forced_detail(
    divergences: list[Divergence],
    failed: list[Divergence],
    mode: str,
    populations: Mapping[str, FlipPopulation],
) -> str:
    if not divergences:
        return (
            "every generated token of target + each draft is the target's greedy choice "
            "(teacher-forced in the same engine)"
        )
    counted = "; ".join(
        f"{draft}: {p.flips} flip(s) above the tie margin against the reference draft's "
        f"{p.control_flips} (binomial p = {p.p_value:.2g}"
        + (f" < {FLIP_EXCESS_ALPHA}: more than the engine's noise)" if p.excess else ")")
        for draft, p in populations.items()
    )
    if failed:
        count = len(failed)
        listed = _listed(failed)
        why = f" [{counted}]" if any(p.excess for p in populations.values()) else ""
        return f"{count} generated token(s) not the target's greedy choice ({mode}){why}: {listed}"
    verdicts = ("tie", "paired", "unpaired", "noise")
    kinds = {v: sum(d.verdict == v for d in divergences) for v in verdicts}
    parts = [f"{kinds['tie']} near-tie(s)"] if kinds["tie"] else []
    if kinds["noise"]:
        largest = max(d.margin or 0.0 for d in divergences if d.verdict == "noise")
        parts.append(
            f"{kinds['noise']} verify-against-prefill flip(s) of the reference draft's own run "
            f"(the engine's noise, margins up to {largest:.3g})"
        )
    if kinds["paired"]:
        parts.append(f"{kinds['paired']} flip(s) the reference draft's run makes too")
    if kinds["unpaired"]:
        parts.append(
            f"{kinds['unpaired']} flip(s) after prefixes the reference draft's run did not "
            f"generate, as many as its own noise ({counted})"
        )
    shown = [d for d in divergences if d.verdict != "noise"] or divergences
    return f"the target's greedy choice except {'; '.join(parts)}: {_listed(shown)}"


def _detail(divergences: list[Divergence], failed: list[Divergence], mode: str) -> str:
    if not divergences:
        return "greedy outputs of target + each draft equal the target alone"
    listed = _listed(failed or divergences)
    if failed:
        return f"{len(failed)} run(s) diverge from the target alone ({mode}): {listed}"
    return f"equal to the target alone except {len(divergences)} near-tie flip(s): {listed}"


def _listed(shown: list[Divergence]) -> str:
    """The first four divergences described, "..." for more."""
    return ", ".join(_describe(d) for d in shown[:4]) + (" ..." if len(shown) > 4 else "")


def _describe(d: Divergence) -> str:
    if d.prompt < 0:
        return f"{d.draft}: a different number of outputs"
    if d.margin is not None:
        margin = f"margin {d.margin:.3g}"
        margin += f" = {d.steps:.3g} BF16 steps" if d.steps is not None else ""
    else:
        margin = "not among the target's top tokens" if d.ranked else "no logprobs"
    return (
        f"{d.draft} prompt {d.prompt} at token {d.position} "
        f"({d.target_token} -> {d.draft_token}, {margin}, {d.verdict})"
    )
