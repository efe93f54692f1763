"""tune's recommendation on recorded measurements: noise, ties, the schedule, the reports."""

from __future__ import annotations

import itertools

import pytest

from eaglequant.tune.choice import (
    schedule_from_winners,
    schedule_problem,
)


@pytest.mark.parametrize(
    "winners",
    [{1: 0, 8: 2}, {4: 8, 8: 6, 16: 6, 32: 4, 64: 0}, {1: 3}, {2: 0, 3: 5, 100: 0}],
)
def test_schedule_passes_vllms_own_validator(winners: dict[int, int]) -> None:
    from vllm.v1.spec_decode.dynamic.utils import (
        build_dynamic_sd_schedule_lookup,
        validate_and_normalize_dynamic_sd_schedule,
    )

    from eaglequant.rules.speculative import schedule_config

    ranges = schedule_from_winners(winners)
    spec = schedule_config("draft", ranges)
    schedule = spec["num_speculative_tokens_per_batch_size"]
    assert validate_and_normalize_dynamic_sd_schedule(schedule) == ranges
    assert ranges[0][0] == 1
    assert all(a[1] < b[0] for a, b in itertools.pairwise(ranges))
    largest = max(winners)
    if spec["num_speculative_tokens"] == 0:
        return  # every range 0: vLLM needs no schedule, tune serves none
    lookup = build_dynamic_sd_schedule_lookup(schedule, largest, spec["num_speculative_tokens"])
    assert [lookup[c] for c in sorted(winners)] == [winners[c] for c in sorted(winners)]


@pytest.mark.parametrize(
    "schedule",
    [
        [(1, 4, 6), (5, 64, 3)],
        [(1, 1, 0), (2, 8, 2)],
        [(1, 1, 0), (3, 8, 2)],  # a gap: vLLM carries the previous k through it
        [(2, 8, 2)],
        [(1, 4, 2), (4, 8, 3)],
        [(1, 8, 3), (9, 4, 2)],
        [(1, 8, -1)],
        [],
    ],
)
def test_a_given_schedule_is_judged_as_vllm_judges_it(schedule: list[tuple[int, int, int]]) -> None:
    from vllm.v1.spec_decode.dynamic.utils import validate_and_normalize_dynamic_sd_schedule

    try:
        validate_and_normalize_dynamic_sd_schedule([list(r) for r in schedule])
    except ValueError:
        assert schedule_problem(schedule) is not None
    else:
        assert schedule_problem(schedule) is None
