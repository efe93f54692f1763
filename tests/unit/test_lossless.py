"""Check 1's near-tie rule on recorded outputs: identical, tie flip, wide-margin flip, strict."""

from __future__ import annotations

import pytest

from eaglequant.results.validation_report import Check
from eaglequant.validate.lossless import first_difference, lossless_check, teacher_forced_check

TARGET = [[5, 6, 7, 8], [1, 2, 3, 4]]
# top logprobs of the target run per prompt and position: [[token, logprob], …] by rank
TOP = [
    [
        [[5, -0.1], [9, -3.0]],
        [[6, -0.70], [11, -0.72]],
        [[7, -0.2], [3, -2.0]],
        [[8, -0.1], [0, -4]],
    ],
    [[[1, -0.1], [2, -5.0]], [[2, -0.3], [12, -1.9]], [[3, -0.4], [1, -1.5]], [[4, -0.2], [0, -3]]],
]


def _check(bf16: list[list[int]], fp8: list[list[int]], mode: str = "near-tie", top=TOP):
    return lossless_check(TARGET, top, {"bf16": bf16, "fp8": fp8}, mode=mode, tie_margin=0.1)


def test_identical_outputs_pass_with_no_divergence() -> None:
    check = _check(TARGET, TARGET)
    assert check.passed and check.numbers["divergences"] == []
    assert check.detail == "greedy outputs of target + each draft equal the target alone"


def test_divergence_at_a_near_tie_passes_and_is_reported() -> None:
    flipped = [[5, 11, 0, 0], TARGET[1]]  # position 1: the target's second token, gap 0.02
    check = _check(TARGET, flipped)
    assert check.passed
    [divergence] = check.numbers["divergences"]
    assert divergence == {
        "draft": "fp8",
        "prompt": 0,
        "position": 1,
        "target_token": 6,
        "draft_token": 11,
        "margin": pytest.approx(0.02),
        "verdict": "tie",
        "ranked": True,
        "steps": None,  # against a target-alone run: logprobs, judged in nats only
        "shared": None,  # no control run there
    }
    assert check.detail == (
        "equal to the target alone except 1 near-tie flip(s): "
        "fp8 prompt 0 at token 1 (6 -> 11, margin 0.02, tie)"
    )


def test_divergence_at_a_wide_margin_fails() -> None:
    flipped = [TARGET[0], [1, 12, 3, 4]]  # position 1 of prompt 1: gap 1.6 nats
    check = _check(flipped, TARGET)
    assert not check.passed
    assert check.detail == (
        "1 run(s) diverge from the target alone (near-tie): "
        "bf16 prompt 1 at token 1 (2 -> 12, margin 1.6, fail)"
    )


def test_divergence_to_a_token_outside_the_recorded_top_fails_even_at_a_tie() -> None:
    check = _check(TARGET, [[5, 99, 0, 0], TARGET[1]])
    assert not check.passed and check.numbers["divergences"][0]["verdict"] == "fail"
    assert "(6 -> 99, not among the target's top tokens, fail)" in check.detail


def test_a_three_way_tie_passes_whichever_tied_token_was_chosen() -> None:
    """BF16 logits can tie exactly three ways (seen at TP=2 on the toy target): the third
    token within the margin is a tie, a fourth beyond it is not."""
    top = [
        [
            [[5, -0.1], [9, -3.0]],
            [[6, -1.0], [11, -1.0], [13, -1.0], [14, -1.5]],
            *TOP[0][2:],
        ],
        TOP[1],
    ]
    assert _check(TARGET, [[5, 13, 0, 0], TARGET[1]], top=top).passed
    check = _check(TARGET, [[5, 14, 0, 0], TARGET[1]], top=top)
    assert not check.passed and "(6 -> 14, margin 0.5, fail)" in check.detail


def test_strict_mode_fails_a_near_tie_flip() -> None:
    check = _check(TARGET, [[5, 11, 0, 0], TARGET[1]], mode="strict")
    assert not check.passed
    assert check.numbers["divergences"][0]["margin"] == pytest.approx(0.02)


def test_without_logprobs_a_divergence_cannot_be_a_tie() -> None:
    check = _check(TARGET, [[5, 11, 0, 0], TARGET[1]], top=None)
    assert not check.passed and "no logprobs" in check.detail


def test_a_missing_prompt_output_fails() -> None:
    check = _check(TARGET, TARGET[:1])
    assert not check.passed and check.detail.endswith("fp8: a different number of outputs")


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [([1, 2], [1, 2], None), ([1, 2], [1, 3], 1), ([1, 2], [1], 1), ([], [], None)],
)
def test_first_difference(a: list[int], b: list[int], expected: int | None) -> None:
    assert first_difference(a, b) == expected


def _forced(fp8: list[list[int]], mode: str = "near-tie", scores=TOP):
    """Teacher-forced scores of each run's own output: TOP is what the target ranked there."""
    return teacher_forced_check(
        {"bf16": (TARGET, TOP), "fp8": (fp8, scores)}, mode=mode, tie_margin=0.1
    )


def test_teacher_forced_greedy_outputs_pass_and_give_the_closest_call() -> None:
    check = _forced(TARGET)
    assert check.passed and check.numbers["divergences"] == []
    assert check.numbers["positions"] == 16 and check.numbers["reference"] == "teacher-forced"
    assert check.numbers["smallest_top2_margin"]["fp8"] == pytest.approx(0.02)
    assert "teacher-forced" in check.detail


def test_teacher_forced_near_tie_passes_each_position_judged_on_its_own() -> None:
    """Token 11 at prompt 0's position 1 was 0.02 nats below the target's best: a near-tie
    (no cascade: the later positions are scored on this run's own prefix)."""
    flipped = [[5, 11, 7, 8], TARGET[1]]
    check = _forced(flipped)
    assert check.passed, check.detail
    (tie,) = check.numbers["divergences"]
    assert (tie["prompt"], tie["position"], tie["verdict"]) == (0, 1, "tie")
    assert not _forced(flipped, mode="strict").passed


def test_teacher_forced_catches_one_changed_token_and_names_where() -> None:
    mutant = [TARGET[0], [1, 2, 1, 4]]  # prompt 1's position 2: 1.1 nats below the best
    check = _forced(mutant)
    assert not check.passed
    (failed,) = check.numbers["divergences"]
    assert (failed["draft"], failed["prompt"], failed["position"]) == ("fp8", 1, 2)
    assert "fp8 prompt 1 at token 2 (3 -> 1, margin 1.1, fail)" in check.detail
    unranked = _forced([TARGET[0], [1, 2, 99, 4]])
    assert "not among the target's top tokens" in unranked.detail and not unranked.passed


def test_teacher_forced_without_scores_fails() -> None:
    """A run whose positions were not all scored, or that scored nothing, cannot pass."""
    assert not _forced(TARGET, scores=[TOP[0], None]).passed
    assert not _forced(TARGET, scores=[TOP[0], TOP[1][:2]]).passed
    assert not _forced(TARGET, scores=[TOP[0]]).passed
    empty = teacher_forced_check({"fp8": ([[]], [[]])})
    assert not empty.passed and empty.detail == "no generated token was scored"


def test_an_exact_tie_listed_first_is_a_tie_not_unranked() -> None:
    """vLLM ranks exactly tied tokens alike, so the run's token may head the target's list
    (measured on the toy target: tokens 12 and 304 both at -0.8452)."""
    top = [[[[304, -0.8452], [12, -0.8452], [83, -3.03]]]]
    check = lossless_check([[12]], top, {"tp2": [[304]]}, mode="near-tie", tie_margin=0.1)
    assert check.passed and check.numbers["divergences"][0]["margin"] == 0.0
    forced = teacher_forced_check({"fp8": ([[304]], top)}, mode="strict")
    assert forced.passed and forced.numbers["divergences"] == []


def test_a_run_without_teacher_forced_scores_asks_for_the_target_alone() -> None:
    """validate starts the target-alone engine for check 1 when a finished draft run came back
    without scores (a vLLM that gave none), and says which."""
    from eaglequant.validate.validation import _unscored

    scored = {"ok": True, "result": {"token_ids": [[1]], "teacher_forced": [[[[1, -0.1]]]]}}
    bare = {"ok": True, "result": {"token_ids": [[1]]}}
    failed = {"ok": False}
    assert _unscored({"bf16": scored, "fp8": scored}) is None
    assert _unscored({"bf16": scored, "fp8": failed}) is None  # the engine check fails instead
    assert _unscored({"bf16": scored, "fp8": bare}) == (
        "the fp8 run has no teacher-forced scores (this vLLM gave none)"
    )


def test_raw_logits_judge_a_near_tie_in_bf16_steps_of_the_best_logit() -> None:
    """The SmolLM2 case: the best raw logit 22.625 (BF16 step 0.125), the generated token
    0.375 below it: 3 steps, a tie at 4 steps, a failure at 2 and at the default (steps not
    used, recorded); and 12.0 below a best of 22.625 is 96 steps, a failure."""
    from eaglequant.validate.lossless import DEFAULT_TIE_STEPS, bf16_step

    assert (bf16_step(22.625), bf16_step(-3.0), bf16_step(0.0)) == (0.125, 2.0**-6, 0.0)
    top = [[[[11, 22.625], [7, 22.25]]]]  # one prompt, one position: raw logits by rank
    tie = teacher_forced_check({"fp8": ([[7]], top)}, tie_margin=0.1, tie_steps=4.0)
    assert tie.passed and tie.numbers["scores"] == "raw_logits"
    (divergence,) = tie.numbers["divergences"]
    assert (divergence["steps"], divergence["verdict"]) == (3.0, "tie")
    assert "margin 0.375 = 3 BF16 steps, tie" in tie.detail
    tight = teacher_forced_check({"fp8": ([[7]], top)}, tie_margin=0.1, tie_steps=2.0)
    assert not tight.passed and tight.numbers["divergences"][0]["verdict"] == "fail"
    far = [[[[11, 22.625], [7, 10.625]]]]
    assert not teacher_forced_check({"fp8": ([[7]], far)}, tie_steps=4.0).passed
    default = teacher_forced_check({"fp8": ([[7]], top)}, tie_steps=DEFAULT_TIE_STEPS)
    assert not default.passed and default.numbers["divergences"][0]["steps"] == 3.0
    # logprobs (no tie_steps): the margin in nats alone, as before
    nats = teacher_forced_check({"fp8": ([[7]], top)}, tie_margin=0.1)
    assert not nats.passed and nats.numbers["scores"] == "logprobs"
    # strict passes no near-tie, in steps either
    assert not teacher_forced_check({"fp8": ([[7]], top)}, mode="strict", tie_steps=4.0).passed


# The paired mode: prompt 1's position 2 scored 1.1 nats below the best (token 1 for 3)
FLIPPED = [TARGET[0], [1, 2, 1, 4]]
# ... and scored 0.5 below it, a flip the size of the engine's noise
NOISY = [TARGET[0], [[1, -0.1], [2, -5.0]], [[2, -0.3], [12, -1.9]], [[3, -0.4], [1, -0.9]]]
NOISY_TOP = [TOP[0], [*NOISY[1:], TOP[1][3]]]


def _paired(
    bf16: list[list[int]], fp8: list[list[int]], reference: str | None = "bf16", top=NOISY_TOP
):
    return teacher_forced_check(
        {"bf16": (bf16, top), "fp8": (fp8, top)}, mode="paired", tie_margin=0.1,
        reference=reference,
    )  # fmt: skip


def test_paired_passes_a_flip_the_reference_run_makes_too_and_records_its_noise() -> None:
    check = _paired(FLIPPED, FLIPPED)
    assert check.passed, check.detail
    noise, paired = check.numbers["divergences"]
    assert (noise["draft"], noise["verdict"], noise["margin"]) == ("bf16", "noise", 0.5)
    assert (paired["draft"], paired["prompt"], paired["position"]) == ("fp8", 1, 2)
    assert paired["verdict"] == "paired" and paired["shared"]
    assert check.numbers["paired_with"] == "bf16"
    assert check.numbers["reference_noise"] == {"flips": 1, "largest_margin": 0.5}
    assert check.numbers["positions_by_draft"] == {"bf16": 8, "fp8": 8}
    assert "1 flip(s) the reference draft's run makes too" in check.detail
    assert "margins up to 0.5" in check.detail


def test_paired_passes_an_unshared_flip_while_the_candidate_flips_no_more_than_its_control() -> (
    None
):
    """The candidate's flip after a prefix the control's run did not generate is the engine's
    noise while the candidate's flips are as many as the control's (here 1 against 0: a
    binomial p of 0.5)."""
    check = _paired(TARGET, FLIPPED)
    assert check.passed, check.detail
    (unpaired,) = check.numbers["divergences"]
    assert (unpaired["draft"], unpaired["verdict"], unpaired["shared"]) == (
        "fp8",
        "unpaired",
        False,
    )
    population = check.numbers["flip_populations"]["fp8"]
    assert (population["flips"], population["control_flips"]) == (1, 0)
    assert population["p_value"] == 0.5 and not population["excess"]
    assert "1 flip(s) after prefixes the reference draft's run did not generate" in check.detail


def _many(count: int, flipped: set[int]) -> tuple[list[list[int]], list]:
    """``count`` one-token prompts (best token 1, token 2 0.25 below); ``flipped`` generate 2."""
    top = [[[[1, -0.5], [2, -0.75]]] for _ in range(count)]
    return [[2] if n in flipped else [1] for n in range(count)], top


def test_paired_fails_every_unshared_flip_of_a_candidate_that_flips_beyond_its_control() -> None:
    """A draft cannot make the verify pass accept another token, so a candidate whose run
    flips far more often than its control's (12 against 0 over as many positions: p = 2.4e-4)
    carries something that reached the target (an FP8 KV cache, say): each flip fails."""
    control, top = _many(40, set())
    candidate, _ = _many(40, set(range(12)))
    runs = {"bf16": (control, top), "fp8": (candidate, top)}
    check = teacher_forced_check(runs, mode="paired", tie_margin=0.1, reference="bf16")
    assert not check.passed
    assert [d["verdict"] for d in check.numbers["divergences"]] == ["fail"] * 12
    assert check.numbers["flip_populations"]["fp8"]["excess"]
    assert "more than the engine's noise" in check.detail
    # as many flips in the control's run (after other prefixes): within the noise, passes
    control, _ = _many(40, set(range(20, 31)))
    check = teacher_forced_check(
        {"bf16": (control, top), "fp8": (candidate, top)}, "paired", 0.1, reference="bf16"
    )
    assert check.passed, check.detail
    assert {d["verdict"] for d in check.numbers["divergences"]} == {"noise", "unpaired"}


def test_paired_fails_a_flip_beyond_the_noise_ceiling_in_any_run() -> None:
    """1.1 nats below the target's best is no tie in any run, the control's own included."""
    check = _paired(FLIPPED, FLIPPED, top=TOP)
    assert not check.passed
    assert [(d["draft"], d["verdict"]) for d in check.numbers["divergences"]] == [
        ("bf16", "fail"),
        ("fp8", "fail"),
    ]


def test_paired_needs_the_same_prefix_not_only_the_same_token() -> None:
    """The reference flipped the same token at the same position, after another prefix: no
    pairing (its context differed), so the candidate's flip is judged with the population."""
    other_prefix = [TARGET[0], [1, 12, 1, 4]]
    check = _paired(other_prefix, FLIPPED)
    assert [d["verdict"] for d in check.numbers["divergences"] if d["draft"] == "fp8"] == [
        "unpaired"
    ]


def test_rejudge_gives_a_recorded_check_its_verdict_again() -> None:
    from eaglequant.validate.lossless import rejudge

    for check in (
        _paired(FLIPPED, FLIPPED),
        _paired(TARGET, FLIPPED),
        _paired(FLIPPED, FLIPPED, top=TOP),
    ):
        again = rejudge(check.numbers)
        assert (again.passed, again.detail) == (check.passed, check.detail)
        assert again.numbers["divergences"] == check.numbers["divergences"]


def test_paired_without_a_reference_run_judges_as_near_tie() -> None:
    check = _paired(FLIPPED, FLIPPED, reference=None)
    assert not check.passed and check.numbers["mode"] == "near-tie"
    assert {d["verdict"] for d in check.numbers["divergences"]} == {"fail"}
    near = _paired([[5, 11, 7, 8], TARGET[1]], [[5, 11, 7, 8], TARGET[1]], reference="absent")
    assert near.passed and {d["verdict"] for d in near.numbers["divergences"]} == {"tie"}


def test_the_control_scored_otherwise_by_a_candidates_engine_fails_check_one() -> None:
    """The control's tokens scored again by the candidate's engine: equal scores (or within a
    BF16 step) are the same target; one position several steps off is another target."""
    from eaglequant.validate.lossless import same_target

    again = [[list(map(list, ranked)) for ranked in prompt] for prompt in NOISY_TOP]
    same = _identity(again)
    assert same.passed, same.detail
    assert same.numbers["target_identity"]["fp8"] == {
        "positions": 8, "differing": 0, "largest": 0.0, "largest_steps": 0.0
    }  # fmt: skip
    again[1][2][1][1] = -0.9 - 2**-8  # one step of a score of magnitude 0.5-1: still the same
    assert _identity(again).passed
    again[1][2][1][1] = -0.95  # 0.05 nats: 12.8 steps
    other = _identity(again)
    assert not other.passed
    assert "fp8's engine scored the bf16 run's tokens otherwise" in other.detail
    assert "at 1 of 8 positions" in other.detail
    assert same_target(NOISY_TOP, NOISY_TOP[:1]).differing == 1  # a prompt not scored again


def _identity(again: list) -> Check:
    return teacher_forced_check(
        {"bf16": (TARGET, NOISY_TOP), "fp8": (TARGET, NOISY_TOP)}, mode="paired",
        tie_margin=0.1, reference="bf16", rescored={"fp8": again},
    )  # fmt: skip
