"""What an engine child is asked to do (its ``spec.json``), as one type.

The parent builds an :class:`EngineRequest` (validate's engine, the shared engine of several
drafts); :func:`eaglequant.engine.process.run_engine_child` writes it as JSON; the child
reads it back with :meth:`EngineRequest.from_json`, which refuses a key it does not know (a
parent and a child of different eaglequant versions) in one line. Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypedDict

from eaglequant.prompts.turns import SecondTurnsJson
from eaglequant.rules.speculative import SpeculativeDict


class ControlTokens(TypedDict):
    """The control run's prompts and outputs as token ids (check 1 scores them again)."""

    prompt_token_ids: list[list[int]]
    token_ids: list[list[int]]


class EngineRequestJson(TypedDict):
    """An :class:`EngineRequest` as the child's ``spec.json`` holds it."""

    llm: dict[str, Any]
    prompts: list[str]
    max_tokens: int
    add_special_tokens: bool
    logprobs: int | None
    teacher_forced: int | None
    draft_ranges: bool
    drafts: list[SpeculativeDict]
    partial_path: str | None
    sample_temperature: float
    sample_seeds: list[int]
    second_turns: SecondTurnsJson | None
    control: ControlTokens | None


@dataclass(frozen=True, kw_only=True)
class EngineRequest:
    llm: dict[str, Any]  # vllm.LLM's arguments before the platform's defaults
    prompts: list[str]
    max_tokens: int
    add_special_tokens: bool = True
    logprobs: int | None = None  # the target's top logprobs per generated token (None: none)
    # Check 1 teacher-forced: the target's best tokens asked per generated position (None: not
    # scored); the engine then returns the target's raw logits for them.
    teacher_forced: int | None = None
    draft_ranges: bool = False  # check 6: record the draft linears' input and output ranges
    drafts: list[SpeculativeDict] = field(default_factory=list)  # a shared engine's, in turn
    partial_path: str | None = None  # a shared engine's file for the runs finished so far
    # After the greedy run, one run sampled at this temperature per seed (a speculative engine:
    # vLLM's rejection sampling), each counted on its own (checks 2 and 5 as served).
    sample_temperature: float = 0.0
    sample_seeds: list[int] = field(default_factory=list)
    # Before the measured runs: answer these first turns greedily, then measure each rendered
    # conversation after the prompts (eaglequant.prompts.turns); None: the prompts alone.
    second_turns: SecondTurnsJson | None = None
    # Check 1: the control run's tokens, scored teacher-forced again by this engine's target
    # after its own run (the same target must score them alike); None: not asked.
    control: ControlTokens | None = None

    def to_json(self) -> EngineRequestJson:
        return {
            "llm": self.llm,
            "prompts": self.prompts,
            "max_tokens": self.max_tokens,
            "add_special_tokens": self.add_special_tokens,
            "logprobs": self.logprobs,
            "teacher_forced": self.teacher_forced,
            "draft_ranges": self.draft_ranges,
            "drafts": self.drafts,
            "partial_path": self.partial_path,
            "sample_temperature": self.sample_temperature,
            "sample_seeds": self.sample_seeds,
            "second_turns": self.second_turns,
            "control": self.control,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EngineRequest:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(
                f"engine request with unknown keys {unknown}: the parent and this engine child "
                "are different eaglequant versions; reinstall one eaglequant"
            )
        return cls(**data)
