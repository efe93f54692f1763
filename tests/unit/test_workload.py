"""The workload label an acceptance figure carries: its fields, its one line, its JSON."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from eaglequant.results.validation_report import EngineSummary, ValidationReport
from eaglequant.results.workload import AcceptanceWorkload, concurrency_of
from tests.conftest import TOY

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


def _report(**changes: object) -> ValidationReport:
    config = {"llm": {"max_num_seqs": 1}, "env": {}, "vllm": "0.32.0", "serve_line": "vllm serve t"}
    report = ValidationReport(
        target="t", draft="d", baseline="b", k=3, prompts=32, max_tokens=48, backend="cpu",
        plugin_active=False, checks=[], prompts_sha256="", chat_template=True,
        prompt_set={"source": "mt-bench", "sha256": "ab", "prompts": 32},
        engines={"bf16": EngineSummary(True, 0, False, 1.0, engine_config=config)},
    )  # fmt: skip
    return replace(report, **changes)  # type: ignore[arg-type]


GREEDY = "mt-bench (32 prompts), chat template, k=3, 48 tokens (EOS ignored), greedy, concurrency 1"


def test_a_validation_report_labels_its_acceptance() -> None:
    from eaglequant.render.terminal import console, print_validation
    from eaglequant.render.validation_tables import validation_markdown

    assert f"\nAcceptance workload: {GREEDY}.\n" in validation_markdown(_report())
    with console.capture() as captured:
        print_validation(_report())
    assert f"Acceptance workload: {GREEDY}." in " ".join(captured.get().split())


def test_a_sampled_report_labels_both_runs() -> None:
    from eaglequant.render.validation_tables import validation_markdown

    sampled = _report(temperature=0.7, sampling_seeds=[0, 1])
    assert sampled.workload().temperature == 0.0
    assert sampled.workload(sampled=True).seeds == (0, 1)
    line = (
        f"Acceptance workload: {GREEDY}; checks 2 and 5: mt-bench (32 prompts), chat template, "
        "k=3, 48 tokens (EOS ignored), temperature 0.7 (seeds 0,1), concurrency 1."
    )
    assert f"\n{line}\n" in validation_markdown(sampled)


def test_a_comparison_labels_each_prompt_sets_acceptance() -> None:
    from eaglequant.render.compare_tables import compare_markdown
    from eaglequant.results.compare_report import (
        COMPARE_SCHEMA_VERSION,
        CompareReport,
        PromptSetSummary,
    )

    workload = AcceptanceWorkload(
        prompt_set="/data/p.jsonl", prompts=8, chat_template=True, k=3, max_tokens=24
    )
    labelled = PromptSetSummary("/data/p.jsonl", "ab" * 32, 8, 3.214, [0.8, 0.6, 0.4], workload)
    older = replace(labelled, workload=None)
    report = CompareReport(
        schema_version=COMPARE_SCHEMA_VERSION, baseline="bf16", target="t", k=3, max_tokens=24,
        baseline_bytes=1, prompt_sets=[labelled, older], rows=[], recommended=None,
        timings_s={}, engine_mode="single", target_loads=1, engine_fallback=None,
    )  # fmt: skip
    data = json.loads(json.dumps(report.to_json()))
    assert data["prompt_sets"][0]["workload"] == workload.to_json()
    assert CompareReport.from_json(data) == report
    text = compare_markdown(report)
    assert (
        "by position 0.800 / 0.600 / 0.400; workload: p.jsonl (8 prompts), chat template, k=3, "
        "24 tokens (EOS ignored), greedy, concurrency all." in text
    )
    assert "by position 0.800 / 0.600 / 0.400." in text  # an older report: no label


def test_tune_labels_each_speculative_runs_acceptance(tmp_path: Path) -> None:
    from eaglequant.render.reports import sweep_markdown
    from eaglequant.tune.request import TuneRequest
    from eaglequant.tune.sweep import TuneResult, summarize

    prompts = tmp_path / "mt.jsonl"
    request = TuneRequest(
        target=TOY / "target", draft=TOY / "draft", ks=(3,), concurrencies=(1, 8), osl=128,
        prompts=prompts, prompts_source="mt-bench", num_prompts=80,
    )  # fmt: skip
    results = [
        TuneResult(k=k, concurrency=c, runs=[100.0 + k], mean_tpot_ms=None,
                   acceptance_length=2.0 if k else None, per_position=[0.5] * k)
        for c in (1, 8) for k in (0, 3)
    ]  # fmt: skip
    summary = summarize(request, results, 512)
    labels = [r.get("workload") for r in summary["results"]]
    assert [w is None for w in labels] == [True, False, True, False]  # no speculation: none
    one = AcceptanceWorkload.from_json(labels[1] or {})
    assert one == AcceptanceWorkload(
        prompt_set="mt-bench", prompts=80, chat_template=False, k=3, max_tokens=128,
        ignore_eos=False, concurrency=1,
    )  # fmt: skip
    text = sweep_markdown(summary)
    label = "mt-bench (80 prompts), no chat template, k=3, up to 128 tokens (stops at EOS), greedy"
    assert f"\n- {label}, concurrency 1\n- {label}, concurrency 8\n" in text
