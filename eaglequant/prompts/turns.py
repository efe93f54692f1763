"""Second turns: a prompt's follow-up, asked after the target's own answer to the prompt.

MT-Bench (and a ``.jsonl`` record with two ``turns``) is a conversation: FastChat's MT-Bench
and SpecForge's ``bench_eagle3.py`` ask the second turn with the model's own first answer in
the context. A command that measures second turns asks the first engine it runs to answer
each first turn greedily (stopping at EOS, at most ``max_tokens``), then renders every
conversation ``[user: first, assistant: answer, user: second]`` through the target's chat
template (``add_generation_prompt``) and measures it as one more prompt. Every later engine of
the command gets those rendered conversations, so each draft is measured on the same text.

A raw prompt (no chat template) continues as the model saw it: the first prompt, its answer,
a blank line, the second turn. Torch-free: the tokenizer is any Hugging Face tokenizer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

RAW_TURN_SEPARATOR = "\n\n"


class SecondTurnJson(TypedDict):
    """One second turn as an engine child is asked it: the measured prompt it follows (an
    index into the engine's prompts, as rendered), and the two user turns."""

    prompt: int
    first: str
    second: str


class SecondTurnsJson(TypedDict):
    """What an engine child is asked (``EngineRequest.second_turns``): answer these first turns
    before the measured runs, render each conversation with ``tokenizer``'s chat template (or
    raw), and measure them after the prompts."""

    turns: list[SecondTurnJson]
    chat_template: bool
    tokenizer: str  # the folder the parent rendered the first turns with
    trust_remote_code: bool
    max_tokens: int  # each answer stops at EOS or here


class AnsweredJson(TypedDict):
    """What the engine that answered the first turns reports (``EngineResult.second_turns``)."""

    prompts: list[str]  # the rendered conversations, measured after the first turns
    answers: list[str]
    answer_tokens: list[int]
    stopped_at_eos: int  # answers that ended before max_tokens
    answered_by: str  # the engine that generated them (target alone, or with which draft)
    answer_s: float


class SecondTurnsRecord(TypedDict):
    """What a report says of its second turns: measured prompt ``first_turns + i`` is the
    second turn of prompt ``of[i]``, asked after an answer the report describes."""

    first_turns: int
    of: list[int]
    answered_by: str
    answer_cap: int
    answer_tokens_mean: float
    answer_tokens_max: int
    stopped_at_eos: int


def second_turn_text(
    tokenizer: Any, use_template: bool, first: str, first_rendered: str, answer: str, second: str
) -> str:
    """One conversation as the target gets it: through ``tokenizer``'s chat template when asked
    and it has one, else ``first_rendered`` continued by the answer and the second turn."""
    if use_template and getattr(tokenizer, "chat_template", None):
        messages = [
            {"role": "user", "content": first},
            {"role": "assistant", "content": answer},
            {"role": "user", "content": second},
        ]
        return str(
            tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        )
    return f"{first_rendered}{answer}{RAW_TURN_SEPARATOR}{second}"


def asked_turns(prompts: Sequence[str], followups: Sequence[str | None]) -> list[SecondTurnJson]:
    """The second turns to ask: one per prompt that has a follow-up, in prompt order."""
    if len(followups) != len(prompts):
        raise ValueError(f"{len(followups)} follow-ups for {len(prompts)} prompts")
    return [
        {"prompt": index, "first": first, "second": second}
        for index, (first, second) in enumerate(zip(prompts, followups, strict=True))
        if second is not None
    ]


@dataclass
class SecondTurns:
    """The second turns of one command's engines: asked until an engine answers them, then the
    rendered conversations every later engine measures after the first turns."""

    asked: SecondTurnsJson
    answered: AnsweredJson | None = None

    def pending(self) -> SecondTurnsJson | None:
        """What the next engine is asked to answer (None: answered already)."""
        return self.asked if self.answered is None else None

    def adopt(self, result: Any) -> None:
        """Keep the answers of an engine ``result`` that generated them (the first one only)."""
        if self.answered is None and isinstance(result, dict) and "second_turns" in result:
            answered = result["second_turns"]
            if len(answered["prompts"]) != len(self.asked["turns"]):
                raise ValueError(
                    f"the engine answered {len(answered['prompts'])} of "
                    f"{len(self.asked['turns'])} first turns"
                )
            self.answered = answered

    def of(self) -> list[int]:
        """The first-turn prompt each second turn follows, in measured order."""
        return [turn["prompt"] for turn in self.asked["turns"]]

    def record(self, first_turns: int) -> SecondTurnsRecord | None:
        """The report's account of the answered second turns (None: none answered)."""
        if self.answered is None:
            return None
        tokens = self.answered["answer_tokens"]
        return {
            "first_turns": first_turns,
            "of": self.of(),
            "answered_by": self.answered["answered_by"],
            "answer_cap": self.asked["max_tokens"],
            "answer_tokens_mean": round(sum(tokens) / len(tokens), 1) if tokens else 0.0,
            "answer_tokens_max": max(tokens, default=0),
            "stopped_at_eos": self.answered["stopped_at_eos"],
        }


def describe(record: SecondTurnsRecord) -> str:
    """One line for a report: which prompts are second turns and where their context came from."""
    count = len(record["of"])
    first = record["first_turns"]
    return (
        f"Second turns: prompts {first + 1}-{first + count} are the second turns of {count} of "
        f"the {first} prompts, each asked after the target's own greedy answer to the first "
        f"({record['answered_by']}; stopped at EOS or {record['answer_cap']} tokens: "
        f"{record['answer_tokens_mean']} tokens on average, at most "
        f"{record['answer_tokens_max']}, {record['stopped_at_eos']} of {count} ended at EOS) "
        "and counted in the prompt's category."
    )
