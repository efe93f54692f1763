"""The validation report (``validate --json``) as one type: its checks, the verdict rule, its
file's kind and schema version, and its reader.

``validate`` builds a :class:`ValidationReport`; every reader (``validate --against``, the
Markdown and JUnit renderers, compare's rows, the model card, publishing) gets one from
:func:`read_report` or from ``validate`` itself and reads attributes. :func:`read_report`
refuses anything but a report of this schema with one line naming the file and what to do.
Torch-free.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from eaglequant.errors import InputError
from eaglequant.prompts.format import PromptSetRecord as PromptSetRecord
from eaglequant.prompts.turns import SecondTurnsRecord
from eaglequant.results.binding import Binding
from eaglequant.results.engine_result import EngineRecord, RequestCounts, SpecMetrics
from eaglequant.results.environment import EnvironmentRecord
from eaglequant.results.manifest import field_values, read_json_object
from eaglequant.results.spec_counts import AcceptanceRecord
from eaglequant.results.workload import AcceptanceWorkload, concurrency_of

if TYPE_CHECKING:  # Python 3.11's; annotations stay strings at run time (3.10 too)
    from typing import NotRequired

    from eaglequant.results.spec_counts import AcceptanceJson

REPORT_KIND = "eaglequant validation report"
SCHEMA_VERSION = 2  # 2: an undecided category check no longer holds back the overall verdict
REPORT_KEYS = ("checks", "engines", "passed", "verdict", "prompts_sha256", "k", "max_tokens")
PER_DRAFT = "per-draft"  # engine_mode: one engine per draft (the other: single, swapped)

PASS = "PASS"
FAIL = "FAIL"
INCONCLUSIVE = "INCONCLUSIVE"  # too few prompts decided a gate
VERDICTS = (PASS, FAIL, INCONCLUSIVE)


def overall_verdict(verdicts: Sequence[str]) -> str:
    """The one verdict rule: FAIL if any is FAIL, else INCONCLUSIVE if any is, else PASS."""
    if FAIL in verdicts:
        return FAIL
    return INCONCLUSIVE if INCONCLUSIVE in verdicts else PASS


class CalibrationOverlap(TypedDict):
    """How many of the prompts the draft was calibrated on (its manifest's text hashes)."""

    calibration: str | None
    shared: int
    prompts: int


class CheckId(StrEnum):
    """Every check a report can hold, by the name it is shown and written under."""

    LOSSLESS = "1 lossless"
    ACCEPTANCE = "2 acceptance"
    LAYERS = "3 layers"
    ENGINE_LOG = "4 engine log"
    PER_POSITION = "5 per-position"
    SCALES = "6 scale plausibility"
    REGRESSION = "7 regression"
    ACCEPTANCE_BY_CATEGORY = "2 acceptance by category"
    PER_POSITION_BY_CATEGORY = "5 per-position by category"
    REGRESSION_BY_CATEGORY = "7 regression by category"
    ENGINES = "engines"  # an engine failed: no other check could run


# Checks over the prompt categories: a category holds a tenth of MT-Bench (10 prompts), too few
# to decide most of the time, so these hold the overall verdict back only when one FAILs. The
# whole set's checks 2 and 5 must still be decided; an undecided category stays INCONCLUSIVE in
# its own row, and the report says which.
ADVISORY_WHEN_UNDECIDED = frozenset(
    {
        CheckId.ACCEPTANCE_BY_CATEGORY,
        CheckId.PER_POSITION_BY_CATEGORY,
        CheckId.REGRESSION_BY_CATEGORY,
    }
)


@dataclass(frozen=True)
class RatioInterval:
    """FP8/BF16 as checks 2 and 5 judge it: the point ratio and its bootstrap interval."""

    point: float
    low: float
    high: float

    def describe(self) -> str:
        return f"{self.point:.3f} [{self.low:.3f}, {self.high:.3f}]"

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RatioInterval:
        return cls(float(data["point"]), float(data["low"]), float(data["high"]))


@dataclass
class Check:
    """One check's outcome. ``verdict`` is PASS, FAIL or INCONCLUSIVE (a pass/fail check:
    PASS or FAIL from ``passed``); ``passed`` is true for PASS alone. ``name`` is a
    :class:`CheckId` (a plain name is taken as one, an unknown one refused)."""

    name: CheckId
    passed: bool
    detail: str
    numbers: dict[str, Any] = field(default_factory=dict)
    verdict: str = ""

    def __post_init__(self) -> None:
        self.name = CheckId(self.name)
        if not self.verdict:
            self.verdict = PASS if self.passed else FAIL
        if self.verdict not in VERDICTS or self.passed != (self.verdict == PASS):
            raise ValueError(
                f"check {self.name}: verdict {self.verdict!r} with passed={self.passed}"
            )

    @property
    def counted(self) -> str:
        """The verdict as it counts towards the report's: an undecided category check's counts
        as PASS (:data:`ADVISORY_WHEN_UNDECIDED`)."""
        if self.verdict == INCONCLUSIVE and self.name in ADVISORY_WHEN_UNDECIDED:
            return PASS
        return self.verdict

    @property
    def intervals(self) -> tuple[RatioInterval, ...]:
        """What checks 2 and 5 judged: FP8/BF16 with its interval (check 2: the mean
        acceptance length's; check 5: each position's); empty for any other check."""
        one = self.numbers.get("interval")
        judged = [one] if one is not None else self.numbers.get("intervals") or []
        return tuple(RatioInterval.from_json(i) for i in judged)

    @property
    def fp8_values(self) -> tuple[float, ...]:
        """What checks 2 and 5 measured of the FP8 draft (check 2: its mean acceptance
        length; check 5: each position's rate); empty for any other check."""
        value = self.numbers.get("fp8")
        if value is None:
            return ()
        return tuple(float(v) for v in value) if isinstance(value, list) else (float(value),)

    @classmethod
    def judged(
        cls, name: CheckId, verdict: str, detail: str, numbers: dict[str, Any] | None = None
    ) -> Check:
        """A check whose verdict comes from :func:`eaglequant.validate.stats.judge`."""
        return cls(name, verdict == PASS, detail, numbers or {}, verdict)


class CheckJson(TypedDict):
    """One check as a report writes it (its name as shown)."""

    name: str
    passed: bool
    detail: str
    numbers: dict[str, Any]
    verdict: str


def check_json(check: Check) -> CheckJson:
    """One check as a report writes it (its name as shown)."""
    return {
        "name": str(check.name),
        "passed": check.passed,
        "detail": check.detail,
        "numbers": asdict(check)["numbers"],
        "verdict": check.verdict,
    }


class CategoryJson(TypedDict):
    """A :class:`CategoryRow` as a report writes it (``checks`` by number: "2", "5")."""

    prompts: int
    bf16: AcceptanceJson
    fp8: AcceptanceJson
    judged: bool
    checks: NotRequired[dict[str, CheckJson]]


@dataclass(frozen=True)
class CategoryRow:
    """One prompt category of a report (``categories.<name>``): its prompts, each draft's
    acceptance pooled over them (with the tokens drafted), and checks 2 and 5 on its prompts
    alone when it is judged (both drafts drafted enough tokens in it)."""

    prompts: int
    bf16: AcceptanceRecord
    fp8: AcceptanceRecord
    checks: tuple[Check, Check] | None = None  # 2 acceptance, 5 per-position

    @property
    def judged(self) -> bool:
        return self.checks is not None

    def to_json(self) -> CategoryJson:
        data: CategoryJson = {
            "prompts": self.prompts,
            "bf16": self.bf16.to_json(),
            "fp8": self.fp8.to_json(),
            "judged": self.judged,
        }
        if self.checks is not None:
            data["checks"] = {n: check_json(c) for n, c in zip("25", self.checks, strict=True)}
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CategoryRow:
        checks = data.get("checks")
        return cls(
            prompts=int(data["prompts"]),
            bf16=AcceptanceRecord.from_json(data["bf16"]),
            fp8=AcceptanceRecord.from_json(data["fp8"]),
            checks=(Check(**checks["2"]), Check(**checks["5"])) if checks else None,
        )


def categories_json(
    categories: Mapping[str, CategoryRow] | None,
) -> dict[str, CategoryJson] | None:
    return None if categories is None else {n: r.to_json() for n, r in categories.items()}


def categories_from_json(data: Mapping[str, Any] | None) -> dict[str, CategoryRow] | None:
    return None if data is None else {n: CategoryRow.from_json(r) for n, r in data.items()}


@dataclass(frozen=True)
class EngineSummary:
    """What a report keeps of one engine run (``engines.<role>``): how it ended, and when it
    finished its timings, vLLM's counters and the acceptance they give, its configuration,
    per-prompt counts (None: no speculation) and outputs; a failed run's log tail. The fields
    after ``wall_s`` are written only where they are set."""

    ok: bool
    returncode: int | None
    timed_out: bool
    wall_s: float
    load_s: float | None = None
    generate_s: float | None = None
    swapped: bool | None = None
    metrics: SpecMetrics | None = None
    kernels: list[str] | None = None
    engine_config: EngineRecord | None = None
    acceptance: AcceptanceRecord | None = None
    per_prompt: list[RequestCounts | None] | None = None
    outputs_sha256: str | None = None
    token_ids: list[list[int]] | None = None
    log_tail: str | None = None

    def to_json(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["acceptance"] = self.acceptance.to_json() if self.acceptance else None
        always = ("ok", "returncode", "timed_out", "wall_s")
        return {key: value for key, value in data.items() if value is not None or key in always}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EngineSummary:
        values = field_values(cls, data)
        if values.get("acceptance") is not None:
            values["acceptance"] = AcceptanceRecord.from_json(values["acceptance"])
        return cls(**values)


@dataclass
class ValidationReport:
    """What ``validate`` measured and decided (its JSON: :meth:`to_json`)."""

    target: str
    draft: str
    baseline: str
    k: int
    prompts: int
    max_tokens: int
    backend: str
    plugin_active: bool
    engines: dict[str, EngineSummary]  # by role
    checks: list[Check]
    prompts_sha256: str
    serve_command: str | None = None
    files: dict[str, Binding] = field(default_factory=dict)  # the bytes validated, by role
    command: str | None = None
    environment: EnvironmentRecord = field(default_factory=EnvironmentRecord)
    chat_template: bool = False
    prompt_set: PromptSetRecord | None = None
    calibration_overlap: CalibrationOverlap | None = None
    categories: dict[str, CategoryRow] | None = None
    min_category_drafts: int | None = None
    prompt_categories: list[str] | None = None
    engine_mode: str = PER_DRAFT
    target_loads: int = 0
    load_s: float = 0.0
    generate_s: float = 0.0
    score_s: float = 0.0  # of generate_s: check 1's teacher-forced scoring
    temperature: float = 0.0  # checks 2 and 5's runs: greedy, or sampled with these seeds
    sampling_seeds: list[int] = field(default_factory=list)
    second_turns: SecondTurnsRecord | None = None  # which prompts are second turns, their context

    @property
    def passed(self) -> bool:
        return self.verdict == PASS

    @property
    def verdict(self) -> str:
        return overall_verdict([c.counted for c in self.checks])

    @property
    def undecided_categories(self) -> list[str]:
        """The category checks left INCONCLUSIVE (they do not hold the verdict back)."""
        return [str(c.name) for c in self.checks if c.counted != c.verdict]

    def workload(self, *, sampled: bool = False) -> AcceptanceWorkload:
        """What the engines' acceptance was measured on (their greedy runs; ``sampled``: the
        runs checks 2 and 5 judged at the report's temperature)."""
        config = next((e.engine_config for e in self.engines.values() if e.engine_config), None)
        sampling = sampled and self.temperature > 0
        return AcceptanceWorkload(
            prompt_set=self.prompt_set["source"] if self.prompt_set else "prompts",
            prompts=self.prompts,
            chat_template=self.chat_template,
            k=self.k,
            max_tokens=self.max_tokens,
            ignore_eos=True,  # every engine run generates to max_tokens
            temperature=self.temperature if sampling else 0.0,
            seeds=tuple(self.sampling_seeds) if sampling else (),
            concurrency=concurrency_of(config["llm"]) if config else None,
        )

    def check(self, name: CheckId) -> Check | None:
        """The check of that name (None: the report has none, e.g. after an engine failed)."""
        return next((c for c in self.checks if c.name == name), None)

    def to_json(self) -> dict[str, Any]:
        data = {"kind": REPORT_KIND, "schema_version": SCHEMA_VERSION, **asdict(self)}
        data["engines"] = {role: e.to_json() for role, e in self.engines.items()}
        data["checks"] = [check_json(c) for c in self.checks]
        data["categories"] = categories_json(self.categories)
        data["files"] = {role: b.to_json() for role, b in self.files.items()}
        data["passed"] = self.passed
        data["verdict"] = self.verdict
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ValidationReport:
        """The report :meth:`to_json` wrote (kind and schema checked by :func:`read_report`)."""
        values = field_values(cls, data)
        values["checks"] = [Check(**check) for check in data["checks"]]
        values["engines"] = {r: EngineSummary.from_json(e) for r, e in data["engines"].items()}
        values["categories"] = categories_from_json(data.get("categories"))
        values["files"] = {r: Binding.from_json(b) for r, b in data.get("files", {}).items()}
        return cls(**values)


def prompts_digest(prompts: list[str]) -> str:
    """One hash of the prompt list, in order: equal hashes, the same prompts."""
    return hashlib.sha256(json.dumps(prompts, ensure_ascii=False).encode()).hexdigest()


def read_report(path: Path) -> ValidationReport:
    """A validation report of this schema; InputError naming ``path`` for anything else."""
    data = read_json_object(path, "validation report")
    kind, version = data.get("kind"), data.get("schema_version")
    if kind != REPORT_KIND:
        if kind is None and "checks" in data and "engines" in data:
            raise InputError(
                f"{path}: a validation report from an older eaglequant (no schema_version); "
                "run eaglequant validate --json again to write a current one"
            )
        raise InputError(
            f"{path}: not an eaglequant validation report (kind {kind!r}); "
            "pass a file written by eaglequant validate --json"
        )
    if version != SCHEMA_VERSION:
        raise InputError(
            f"{path}: validation report schema_version {version!r}, this eaglequant reads "
            f"{SCHEMA_VERSION}; run eaglequant validate --json again with this version"
        )
    missing = [key for key in REPORT_KEYS if key not in data]
    if missing:
        raise InputError(f"{path}: validation report without {missing}; the file is incomplete")
    try:
        report = ValidationReport.from_json(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(
            f"{path}: not a complete validation report ({exc}); run eaglequant validate "
            "--json again to write a current one"
        ) from exc
    if (data["passed"], data["verdict"]) != (report.passed, report.verdict):
        raise InputError(
            f"{path}: says passed={data['passed']!r}, verdict {data['verdict']!r}, but its checks "
            f"give passed={report.passed}, {report.verdict}; the file was changed after "
            "validate wrote it: run eaglequant validate --json again"
        )
    return report
