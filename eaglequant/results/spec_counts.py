"""Speculative-decoding counts: one type for every reader (validate, compare, categories,
regression, tune, render), in one vocabulary.

vLLM counts per engine ``vllm:spec_decode_num_drafts``, ``..._num_draft_tokens``,
``..._num_accepted_tokens`` and ``..._num_accepted_tokens_per_pos`` (one per draft position;
``vllm/v1/spec_decode/metrics.py``, whose ``SpecDecodingStats`` is this type's model), and per
request a histogram of verify steps by tokens accepted (``per_request_spec_decode_metrics``).
:class:`SpecDecodeCounts` holds either, adds and subtracts (pooling prompts or repeats, the
difference of two snapshots), and gives the mean acceptance length (1 + accepted / drafts, as
vLLM's own example prints it) and each position's acceptance rate (accepted there / drafts);
:class:`AcceptanceRecord` is what a validation report shows of them.

The engine result's JSON keeps vLLM's counter names (:data:`VLLM_KEYS`): it is what the
engine child reports. Torch-free.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:  # Python 3.11's; annotations stay strings at run time (3.10 too)
    from typing import NotRequired

    from eaglequant.results.engine_result import SpecMetrics

# The engine result's (and LLM.get_metrics()'s) names for the fields, in field order.
VLLM_KEYS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "accepted_per_pos")


@dataclass(frozen=True)
class SpecDecodeCounts:
    """Verify steps that drafted (``drafts``), tokens drafted and accepted, and by draft
    position (0-based) the steps whose draft was accepted up to and including it."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_position: tuple[int, ...] = ()

    @classmethod
    def from_histogram(cls, histogram: Sequence[int], draft_tokens: int) -> SpecDecodeCounts:
        """One request's counts from its histogram (``histogram[j]``: steps accepting ``j``)."""
        k = max(len(histogram) - 1, 0)
        return cls(
            drafts=sum(histogram),
            draft_tokens=draft_tokens,
            accepted_tokens=sum(j * count for j, count in enumerate(histogram)),
            accepted_per_position=tuple(sum(histogram[p + 1 :]) for p in range(k)),
        )

    @classmethod
    def from_vllm(cls, metrics: Mapping[str, Any]) -> SpecDecodeCounts:
        """From the engine result's counters (vLLM's names; absent ones count 0)."""
        return cls(
            drafts=int(metrics.get("num_drafts", 0)),
            draft_tokens=int(metrics.get("num_draft_tokens", 0)),
            accepted_tokens=int(metrics.get("num_accepted_tokens", 0)),
            accepted_per_position=tuple(int(a) for a in metrics.get("accepted_per_pos") or ()),
        )

    def to_vllm(self) -> SpecMetrics:
        """The engine result's counters, under vLLM's names."""
        return {
            "num_drafts": self.drafts,
            "num_draft_tokens": self.draft_tokens,
            "num_accepted_tokens": self.accepted_tokens,
            "accepted_per_pos": list(self.accepted_per_position),
        }

    @staticmethod
    def total(counts: Iterable[SpecDecodeCounts]) -> SpecDecodeCounts:
        """The sum of ``counts`` (no counts: zero)."""
        found = SpecDecodeCounts()
        for one in counts:
            found = found + one
        return found

    def __add__(self, other: SpecDecodeCounts) -> SpecDecodeCounts:
        return self._combine(other, 1)

    def __sub__(self, before: SpecDecodeCounts) -> SpecDecodeCounts:
        return self._combine(before, -1)

    def _combine(self, other: SpecDecodeCounts, sign: int) -> SpecDecodeCounts:
        k = max(len(self.accepted_per_position), len(other.accepted_per_position))
        mine = self.accepted_per_position + (0,) * (k - len(self.accepted_per_position))
        theirs = other.accepted_per_position + (0,) * (k - len(other.accepted_per_position))
        return SpecDecodeCounts(
            drafts=self.drafts + sign * other.drafts,
            draft_tokens=self.draft_tokens + sign * other.draft_tokens,
            accepted_tokens=self.accepted_tokens + sign * other.accepted_tokens,
            accepted_per_position=tuple(a + sign * b for a, b in zip(mine, theirs, strict=True)),
        )

    @property
    def mean_acceptance_length(self) -> float | None:
        """1 + accepted / drafts (None: nothing drafted)."""
        return 1 + self.accepted_tokens / self.drafts if self.drafts else None

    @property
    def per_position_rates(self) -> list[float]:
        """Each draft position's acceptance rate, accepted there / drafts ([]: nothing drafted)."""
        return [a / self.drafts for a in self.accepted_per_position] if self.drafts else []

    def acceptance(self, *, with_draft_tokens: bool = False) -> AcceptanceRecord:
        """What a report shows of these counts (a category's also says the tokens drafted)."""
        return AcceptanceRecord(
            mean_length=self.mean_acceptance_length,
            per_position=tuple(self.per_position_rates),
            drafts=self.drafts,
            accepted=self.accepted_tokens,
            draft_tokens=self.draft_tokens if with_draft_tokens else None,
        )


class AcceptanceJson(TypedDict):
    """:class:`AcceptanceRecord` as a report writes it."""

    mean_length: float | None
    per_position: list[float]
    drafts: int
    accepted: int
    draft_tokens: NotRequired[int]


@dataclass(frozen=True)
class AcceptanceRecord:
    """A validation report's acceptance (``engines.<role>.acceptance``, a category's
    ``bf16``/``fp8``): mean acceptance length and per position, with the counts they come from
    (``draft_tokens``: written only where it is set, in the category rows)."""

    mean_length: float | None
    per_position: tuple[float, ...]
    drafts: int
    accepted: int
    draft_tokens: int | None = None

    def to_json(self) -> AcceptanceJson:
        data: AcceptanceJson = {
            "mean_length": self.mean_length,
            "per_position": list(self.per_position),
            "drafts": self.drafts,
            "accepted": self.accepted,
        }
        if self.draft_tokens is not None:
            data["draft_tokens"] = self.draft_tokens
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AcceptanceRecord:
        draft_tokens = data.get("draft_tokens")
        return cls(
            mean_length=data["mean_length"],
            per_position=tuple(data["per_position"]),
            drafts=int(data["drafts"]),
            accepted=int(data["accepted"]),
            draft_tokens=None if draft_tokens is None else int(draft_tokens),
        )
