"""The workload label an acceptance figure carries: its fields, its one line, its JSON."""

from __future__ import annotations

import pytest

from eaglequant.workload import AcceptanceWorkload, concurrency_of

pytestmark = pytest.mark.unit

MT_BENCH = AcceptanceWorkload(
    prompt_set="mt-bench", prompts=80, chat_template=True, k=3, max_tokens=128
)


def test_greedy_label_names_every_field() -> None:
    assert MT_BENCH.describe() == (
        "mt-bench (80 prompts), chat template, k=3, 128 tokens (EOS ignored), greedy, "
        "concurrency all"
    )


def test_sampled_label_names_temperature_seeds_and_stopping() -> None:
    sampled = AcceptanceWorkload(
        prompt_set="sharegpt:1",
        prompts=1,
        chat_template=False,
        k=5,
        max_tokens=256,
        ignore_eos=False,
        temperature=0.7,
        seeds=(0, 1),
        concurrency=1,
    )
    assert sampled.describe() == (
        "sharegpt:1 (1 prompt), no chat template, k=5, up to 256 tokens (stops at EOS), "
        "temperature 0.7 (seeds 0,1), concurrency 1"
    )


def test_labels_differ_where_workloads_do() -> None:
    longer = AcceptanceWorkload(
        prompt_set="mt-bench", prompts=80, chat_template=True, k=3, max_tokens=256
    )
    assert longer != MT_BENCH
    assert longer.describe() != MT_BENCH.describe()


def test_json_round_trip() -> None:
    sampled = AcceptanceWorkload(
        prompt_set="x.jsonl",
        prompts=8,
        chat_template=True,
        k=2,
        max_tokens=32,
        temperature=0.6,
        seeds=(3,),
        concurrency=4,
    )
    for workload in (MT_BENCH, sampled):
        data = workload.to_json()
        assert AcceptanceWorkload.from_json(data) == workload
    assert MT_BENCH.to_json() == {
        "prompt_set": "mt-bench",
        "prompts": 80,
        "chat_template": True,
        "k": 3,
        "max_tokens": 128,
        "ignore_eos": True,
        "temperature": 0.0,
        "seeds": [],
        "concurrency": None,
    }


@pytest.mark.parametrize(
    "changes",
    [{"k": 0}, {"max_tokens": 0}, {"temperature": -0.1}, {"prompts": -1}, {"concurrency": 0}],
)
def test_impossible_workloads_are_refused(changes: dict[str, float]) -> None:
    fields = MT_BENCH.to_json() | changes
    with pytest.raises(ValueError):
        AcceptanceWorkload.from_json(fields)


def test_concurrency_is_max_num_seqs() -> None:
    assert concurrency_of({}) is None
    assert concurrency_of({"max_num_seqs": 1, "enforce_eager": True}) == 1
