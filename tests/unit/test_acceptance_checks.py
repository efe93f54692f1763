"""Checks 2 and 5 on engine results made of per-prompt counts recorded from real vLLM runs."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from eaglequant.recipe import ValidationSpec
from eaglequant.render.junit import junit_xml
from eaglequant.render.validation_tables import validation_markdown
from eaglequant.results.engine_result import EngineRun, RequestCounts, SampledRun, SpecMetrics
from eaglequant.results.validation_report import Check, CheckId, EngineSummary, ValidationReport
from eaglequant.validate.acceptance_checks import (
    AcceptanceThresholds,
    engine_acceptance_checks,
    judged_counts,
    sum_counts,
)
from eaglequant.validate.stats import PromptCounts
from tests.support import engine_result, finished_engine
from tests.unit import recorded_counts as recorded


def engine(rows: list[tuple[tuple[int, ...], int]], metrics: SpecMetrics) -> EngineRun:
    """An engine entry as ``run_engine`` returns it, holding the recorded counts."""
    per_request: list[RequestCounts | None] = [
        {"histogram": list(h), "num_draft_tokens": n} for h, n in rows
    ]
    return finished_engine(engine_result(metrics, per_request))


BF16 = engine(recorded.BF16, recorded.BF16_METRICS)
FP8 = engine(recorded.FP8, recorded.FP8_METRICS)
COARSE = engine(recorded.COARSE, recorded.COARSE_METRICS)
RANDOM = engine(recorded.RANDOM, recorded.RANDOM_METRICS)


def checks(fp8: EngineRun, **changes: float) -> tuple[Check, Check]:
    spec = ValidationSpec()
    thresholds = AcceptanceThresholds(
        min_acceptance_ratio=changes.get("min_acceptance_ratio", spec.min_acceptance_ratio),
        min_position_ratio=changes.get("min_position_ratio", spec.min_position_ratio),
    )
    return engine_acceptance_checks({"bf16": BF16, "fp8": fp8}, thresholds)


def test_the_toy_export_passes_both_with_its_intervals() -> None:
    two, five = checks(FP8)
    assert (two.verdict, five.verdict) == ("PASS", "PASS") and two.passed and five.passed
    assert two.detail == (
        "FP8 mean acceptance length 3.190 vs BF16 3.214: ratio 0.992 [0.982, 1.002], "
        "required >= 0.98: PASS; 95% paired-bootstrap interval over 32 prompts "
        "(2000 resamples, seed 0)"
    )
    assert five.detail.startswith(
        "pos 1: FP8 0.862 / BF16 0.868, ratio 0.994 [0.984, 1.002], required >= 0.95: PASS; "
        "pos 2: FP8 0.693 / BF16 0.702, ratio 0.988 [0.965, 1.010], required >= 0.95: PASS; "
    )
    assert two.numbers["interval"]["low"] == pytest.approx(0.982, abs=5e-4)
    assert five.numbers["verdicts"] == ["PASS"] * 3


def test_a_straddling_interval_is_inconclusive_and_not_passed() -> None:
    two, five = checks(COARSE)
    assert two.verdict == "INCONCLUSIVE" and not two.passed
    needed = two.numbers["prompts_needed"]
    assert needed > 32
    assert f"required >= 0.98: INCONCLUSIVE (about {needed} prompts would decide)" in two.detail
    assert five.verdict == "PASS"


def test_each_position_is_judged_against_the_per_position_ratio() -> None:
    _, five = checks(COARSE, min_position_ratio=1.0)
    assert five.numbers["verdicts"] == ["INCONCLUSIVE", "INCONCLUSIVE", "FAIL"]
    assert five.verdict == "FAIL" and "ratio 0.980 [0.956, 0.998]" in five.detail


def test_a_random_draft_fails_both() -> None:
    two, five = checks(RANDOM)
    assert (two.verdict, five.verdict) == ("FAIL", "FAIL")


def test_counts_that_disagree_with_the_engine_fail_both() -> None:
    bad = engine(recorded.FP8, recorded.FP8_METRICS | {"num_drafts": 480})
    two, five = checks(bad)
    message = (
        "per-prompt counts disagree with vLLM's counters: num_drafts 479 summed over prompts "
        "vs 480 counted by vLLM"
    )
    assert (two.verdict, two.detail) == ("FAIL", message)
    assert (five.verdict, five.detail) == ("FAIL", message)


def test_missing_per_prompt_counts_fail() -> None:
    missing = finished_engine(engine_result(recorded.FP8_METRICS, None))
    two, _ = checks(missing)
    assert two.detail == "vLLM reported no per-prompt spec-decode counts"


def test_one_prompt_without_counts_fails() -> None:
    fp8 = engine(recorded.FP8, recorded.FP8_METRICS)
    per_request = fp8["result"]["per_request"]
    assert per_request is not None
    gap = finished_engine(engine_result(recorded.FP8_METRICS, [*per_request[:-1], None]))
    two, five = checks(gap)
    assert (two.verdict, two.detail) == ("FAIL", "vLLM reported no per-prompt spec-decode counts")
    assert five.verdict == "FAIL"


def test_a_check_verdict_agrees_with_passed() -> None:
    assert Check(CheckId.LAYERS, True, "").verdict == "PASS"
    assert Check(CheckId.LAYERS, False, "").verdict == "FAIL"
    assert not Check.judged(CheckId.ACCEPTANCE, "INCONCLUSIVE", "").passed
    with pytest.raises(ValueError, match="verdict 'INCONCLUSIVE' with passed=True"):
        Check(CheckId.ACCEPTANCE, True, "", {}, "INCONCLUSIVE")
    with pytest.raises(ValueError, match="'x' is not a valid CheckId"):
        Check("x", True, "")  # type: ignore[arg-type]  # an unknown check is refused
    assert Check("3 layers", True, "").name is CheckId.LAYERS  # type: ignore[arg-type]


def test_inconclusive_renders_as_such_in_markdown_and_junit() -> None:
    two, five = checks(COARSE)
    report = ValidationReport(
        target="t", draft="out/draft-fp8", baseline="b", k=3, prompts=32, max_tokens=48,
        backend="cpu", plugin_active=True, engines={}, checks=[two, five], prompts_sha256="",
    )  # fmt: skip
    text = validation_markdown(report)
    assert "| 2 acceptance | INCONCLUSIVE |" in text and "| 5 per-position | PASS |" in text
    assert "**Validation INCONCLUSIVE (too few prompts to decide).**" in text
    assert '<failure message="INCONCLUSIVE: FP8 mean acceptance length' in junit_xml([report])


def test_a_subset_of_prompts_is_judged_on_its_own() -> None:
    """One category's prompts: the counts of those prompts alone, a wider interval."""
    from eaglequant.validate.acceptance_checks import acceptance_checks
    from eaglequant.validate.stats import PromptCounts

    half = [[PromptCounts(h, n) for h, n in rows[:16]] for rows in (recorded.FP8, recorded.BF16)]
    thresholds = AcceptanceThresholds(min_acceptance_ratio=0.98, min_position_ratio=0.95)
    two, _ = acceptance_checks(half[0], half[1], thresholds)
    whole, _ = checks(FP8)
    assert two.numbers["interval"]["prompts"] == 16 and "over 16 prompts" in two.detail
    width = two.numbers["interval"]["high"] - two.numbers["interval"]["low"]
    assert width > whole.numbers["interval"]["high"] - whole.numbers["interval"]["low"]


def test_the_terminal_shows_the_inconclusive_verdict() -> None:
    from eaglequant.render.terminal import console, print_validation

    two, five = checks(COARSE)
    report = ValidationReport(
        target="t", draft="d", baseline="b", k=3, prompts=32, max_tokens=48, backend="cpu",
        plugin_active=True, engines={}, checks=[two, five], prompts_sha256="",
    )  # fmt: skip
    with console.capture() as captured:
        print_validation(report)
    text = captured.get()
    assert re.search(r"│ 2 acceptance +│ INCONCLUSIVE │", text), text
    assert text.rstrip().endswith("validation INCONCLUSIVE: too few prompts to decide")


def test_the_markdown_names_the_reproducing_engine_env_only() -> None:
    """A per-run variable (a port, a random path) stays in the JSON, not in validation.md."""
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_RPC_BASE_PATH": "/tmp/x1", "VLLM_PORT": "5123"}
    config = {"llm": {}, "env": env, "vllm": "0.32.0", "serve_line": "vllm serve t"}
    report = ValidationReport(
        target="t", draft="d", baseline="b", k=3, prompts=1, max_tokens=8, backend="cpu",
        plugin_active=False, checks=[], prompts_sha256="",
        engines={"fp8": EngineSummary(True, 0, False, 1.0, engine_config=config)},
    )  # fmt: skip
    text = validation_markdown(report)
    assert "vLLM 0.32.0; environment: `VLLM_CPU_KVCACHE_SPACE=1`." in text


def test_checks_2_and_5_read_back_what_they_judged_by_attribute() -> None:
    acceptance, per_position = checks(FP8)
    (ratio,) = acceptance.intervals
    assert ratio.point == acceptance.numbers["ratio"]
    assert (ratio.low, ratio.high) == (
        acceptance.numbers["interval"]["low"],
        acceptance.numbers["interval"]["high"],
    )
    assert ratio.describe() in acceptance.detail
    assert acceptance.fp8_values == (acceptance.numbers["fp8"],)
    assert [i.point for i in per_position.intervals] == [
        i["point"] for i in per_position.numbers["intervals"]
    ]
    assert per_position.fp8_values == tuple(per_position.numbers["fp8"])
    other = Check(CheckId.LAYERS, True, "fc, lm_head unquantized")
    assert other.intervals == () and other.fp8_values == ()


def _sampled(runs: list[tuple[int, EngineRun]], greedy: EngineRun) -> EngineRun:
    """``greedy``'s engine entry holding ``runs`` (seed, an engine entry's counts) as the runs
    sampled after it."""
    sampled: list[SampledRun] = []
    for seed, run in runs:
        result = run["result"]
        per_request = result["per_request"] or []
        sampled.append(
            {"temperature": 0.7, "seed": seed, "per_request": per_request,
             "metrics": result["metrics"], "generate_s": 1.0}
        )  # fmt: skip
    return finished_engine(greedy["result"] | {"sampled": sampled})


def test_sampled_runs_are_judged_each_prompt_summed_over_its_seeds() -> None:
    """Two sampled runs of each draft (recorded counts standing in): per prompt their counts
    add, the greedy run is not judged, and the detail says how the runs decoded."""
    fp8 = _sampled([(0, FP8), (1, COARSE)], RANDOM)  # the greedy run would fail both
    bf16 = _sampled([(0, BF16), (1, BF16)], BF16)
    counts = judged_counts(fp8["result"])
    assert counts[0] == sum_counts(
        [PromptCounts(*recorded.FP8[0]), PromptCounts(*recorded.COARSE[0])]
    )
    assert counts[0].num_draft_tokens == recorded.FP8[0][1] + recorded.COARSE[0][1]
    thresholds = AcceptanceThresholds(
        min_acceptance_ratio=0.98, min_position_ratio=0.95, temperature=0.7, sampling_seeds=(0, 1)
    )
    two, five = engine_acceptance_checks({"bf16": bf16, "fp8": fp8}, thresholds)
    assert two.verdict != "FAIL" and five.verdict != "FAIL"
    assert two.detail.endswith(
        "95% paired-bootstrap interval over 32 prompts (2000 resamples, seed 0); sampled at "
        "temperature 0.7 with seeds 0, 1, each prompt's counts summed over its seeds"
    )
    assert (two.numbers["temperature"], two.numbers["sampling_seeds"]) == (0.7, [0, 1])
    assert five.numbers["sampling_seeds"] == [0, 1]
    greedy, _ = checks(FP8)
    assert greedy.numbers["temperature"] == 0.0 and "sampling_seeds" not in greedy.numbers


def test_a_sampled_run_whose_counts_disagree_with_vllm_fails_naming_its_seed() -> None:
    bad = engine(recorded.FP8, recorded.FP8_METRICS | {"num_drafts": 480})
    fp8 = _sampled([(0, FP8), (3, bad)], FP8)
    two, five = checks(fp8)
    assert two.verdict == five.verdict == "FAIL"
    assert two.detail == (
        "the run sampled with seed 3: per-prompt counts disagree with vLLM's counters: "
        "num_drafts 479 summed over prompts vs 480 counted by vLLM"
    )


@pytest.mark.parametrize(
    ("temperature", "seeds", "message"),
    [
        (0.0, (1,), "sampling seeds [1] without a temperature: give a temperature above 0 to "
         "sample, or no seed for greedy"),
        (0.7, (), "temperature 0.7: name at least one sampling seed"),
        (0.7, (2, 2), "sampling seeds [2, 2]: give each seed once, 0 or more"),
        (-1.0, (), "temperature -1.0: give 0 (greedy) or more"),
    ],
)  # fmt: skip
def test_a_sampling_request_is_checked_before_any_engine(
    temperature: float, seeds: tuple[int, ...], message: str
) -> None:
    from eaglequant.errors import InputError
    from eaglequant.validate.request import check_sampling

    with pytest.raises(InputError) as raised:
        check_sampling(temperature, seeds)
    assert str(raised.value) == message
    check_sampling(0.0, ())
    check_sampling(0.7, (0, 1))


def test_a_sampled_report_says_how_its_runs_decoded() -> None:
    from eaglequant.hub.card import validated_temperatures

    two, five = checks(FP8)
    report = ValidationReport(
        target="t", draft="d", baseline="b", k=3, prompts=32, max_tokens=48, backend="cpu",
        plugin_active=False, engines={}, checks=[two, five], prompts_sha256="",
        prompt_set={"source": "mt-bench", "sha256": "ab", "prompts": 32},
    )  # fmt: skip
    assert "32 prompts x 48 tokens, greedy; backend cpu." in validation_markdown(report)
    sampled = replace(report, temperature=0.7, sampling_seeds=[0, 1, 2])
    assert (
        "32 prompts x 48 tokens, greedy, and checks 2 and 5 on runs sampled at temperature 0.7 "
        "(seeds 0, 1, 2; each prompt's counts summed over them); backend cpu."
    ) in validation_markdown(sampled)
    assert "| draft | greedy mean acceptance length | greedy acceptance by position |" in (
        validation_markdown(sampled)
    )
    assert "| draft | mean acceptance length | acceptance by position |" in (
        validation_markdown(report)
    )
    assert ValidationReport.from_json(sampled.to_json()) == sampled
    assert (
        ValidationReport.from_json(
            {
                k: v
                for k, v in sampled.to_json().items()
                if k not in ("temperature", "sampling_seeds")
            }
        )
        == report
    )  # a report that names no temperature was judged greedy
    other = replace(sampled, prompt_set={"source": "humaneval", "sha256": "cd", "prompts": 32})
    assert validated_temperatures([report, sampled, other]) == (
        "Acceptance (checks 2 and 5) validated at temperature 0 (greedy) on `mt-bench`; "
        "0.7 (sampled) on `mt-bench`, `humaneval`; lossless output (check 1) is checked greedy.\n"
    )
