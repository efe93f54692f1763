"""The workload an acceptance figure was measured on, as one label every report prints.

A mean acceptance length (:class:`~eaglequant.results.spec_counts.SpecDecodeCounts`: 1 + accepted /
drafts, vLLM's definition) says little without what produced it: the same draft measures
differently on another prompt set, with or without the chat template, at another k, over
more tokens (a draft accepts less deep into an answer), sampled rather than greedy, or with
answers stopped at EOS rather than generated to the token limit. :class:`AcceptanceWorkload`
holds those, and :meth:`AcceptanceWorkload.describe` writes them in one line beside the
figure, so two figures are compared only where their labels agree. Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

# Tokens generated per prompt unless a command is told otherwise (validate, compare and
# acceptance alike): the reference workload's answer length (MT-Bench, chat template, k=3,
# greedy), on which the category checks and the commands' agreement were measured.
MAX_TOKENS = 128


class WorkloadJson(TypedDict):
    """:class:`AcceptanceWorkload` as a report writes it."""

    prompt_set: str
    prompts: int
    chat_template: bool
    k: int
    max_tokens: int
    ignore_eos: bool
    temperature: float
    seeds: list[int]
    concurrency: int | None


@dataclass(frozen=True, kw_only=True)
class AcceptanceWorkload:
    """What an acceptance figure was measured on.

    ``prompt_set``: the source as given (``mt-bench``, ``sharegpt:100``, a file's name);
    ``ignore_eos``: every answer generated to ``max_tokens`` (else stopped at EOS);
    ``temperature`` 0 is greedy, above it one run per seed under vLLM's rejection sampling;
    ``concurrency``: the most requests in flight (vLLM's ``max_num_seqs``), None where every
    prompt was submitted at once to vLLM's default.
    """

    prompt_set: str
    prompts: int
    chat_template: bool
    k: int
    max_tokens: int
    ignore_eos: bool = True
    temperature: float = 0.0
    seeds: tuple[int, ...] = ()
    concurrency: int | None = None

    def __post_init__(self) -> None:
        if self.k < 1 or self.max_tokens < 1 or self.prompts < 0 or self.temperature < 0:
            raise ValueError(f"not a workload: {self!r}")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency {self.concurrency}: give 1 or more, or None")

    def describe(self) -> str:
        """One line, e.g. ``mt-bench (80 prompts), chat template, k=3, 128 tokens (EOS
        ignored), greedy, concurrency all``."""
        template = "chat template" if self.chat_template else "no chat template"
        tokens = (
            f"{self.max_tokens} tokens (EOS ignored)"
            if self.ignore_eos
            else f"up to {self.max_tokens} tokens (stops at EOS)"
        )
        if self.temperature:
            seeds = ",".join(str(s) for s in self.seeds) or "none"
            sampling = f"temperature {self.temperature:g} (seeds {seeds})"
        else:
            sampling = "greedy"
        concurrency = "all" if self.concurrency is None else str(self.concurrency)
        count = f"{self.prompts} prompt{'' if self.prompts == 1 else 's'}"
        return (
            f"{self.prompt_set} ({count}), {template}, k={self.k}, {tokens}, {sampling}, "
            f"concurrency {concurrency}"
        )

    def to_json(self) -> WorkloadJson:
        return {
            "prompt_set": self.prompt_set,
            "prompts": self.prompts,
            "chat_template": self.chat_template,
            "k": self.k,
            "max_tokens": self.max_tokens,
            "ignore_eos": self.ignore_eos,
            "temperature": self.temperature,
            "seeds": list(self.seeds),
            "concurrency": self.concurrency,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AcceptanceWorkload:
        concurrency = data.get("concurrency")
        return cls(
            prompt_set=str(data["prompt_set"]),
            prompts=int(data["prompts"]),
            chat_template=bool(data["chat_template"]),
            k=int(data["k"]),
            max_tokens=int(data["max_tokens"]),
            ignore_eos=bool(data.get("ignore_eos", True)),
            temperature=float(data.get("temperature", 0.0)),
            seeds=tuple(int(s) for s in data.get("seeds") or ()),
            concurrency=None if concurrency is None else int(concurrency),
        )


def concurrency_of(engine_args: Mapping[str, Any]) -> int | None:
    """The most requests in flight an engine's arguments allow (``max_num_seqs``; None: vLLM's
    default, every prompt submitted at once)."""
    value = engine_args.get("max_num_seqs")
    return None if value is None else int(value)
