"""The records the example's scripts write and pass on, one type each: the training run's
summary, the prompts prepared for answering, the held-out sets' overlap, ``recipe.json`` (as
:mod:`eaglequant_examples.reproduce` and :mod:`eaglequant_examples.accelerated` write it),
the acceptance measure's and the conversion check's results. Torch-free: types only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:  # Python 3.11's; annotations stay strings at run time (3.10 too)
    from typing import NotRequired

    from eaglequant.results.workload import WorkloadJson

# A ``DataRecipe`` or ``TrainRecipe`` as ``dataclasses.asdict`` writes it
RecipeFields = dict[str, str | int | float]


class HeldOut(TypedDict):
    """The held-out sequences' top-1 by step after each epoch, and the epoch kept."""

    sequences: int
    top1_by_step_by_epoch: list[list[float]]
    chosen_epoch: int


class TrainResult(TypedDict):
    """What :func:`eaglequant_examples.train_draft.train` returns (``recipe.json``'s
    ``result``)."""

    steps: int
    top1_by_step_smoothed: list[float]
    held_out: NotRequired[HeldOut]


class HeldOutSet(TypedDict):
    """One held-out prompt set: its prompts, and how many a training prompt equals or shares a
    run of 8 words with."""

    prompts: int
    sha256: str
    exact: int
    shared_8_words: int


# ``rule``, then each held-out set's :class:`HeldOutSet` by its source (and, once the
# overlapping prompts are left out, ``left_out_overlapping``: how many)
Disjointness = dict[str, str | int | HeldOutSet]


class PreparedPrompts(TypedDict):
    """The training prompts as tokenized for answering: taken, kept under the length cap."""

    prompts: int
    kept: int
    sha256: str
    held_out_sets: Disjointness


class AnswersTrained(TypedDict):
    """What the accelerated recipe trained on and how: the draft's training summary."""

    sequences: int
    tokens: int
    answer_tokens: int
    aux_layers: list[int]
    result: TrainResult
    timings: dict[str, float]


class LeaseSummary(AnswersTrained):
    """``summary.json`` of one accelerated run on a lent device (these keys first)."""

    device: str
    torch: str
    target_weights_digest: str
    prompts_answered: int
    max_answer_tokens: int
    train: RecipeFields


class ChunkFile(TypedDict):
    file: str
    sha256: str


class ChunkedAnswers(TypedDict):
    chunks: list[ChunkFile]
    sequences: int
    tokens: int
    answer_tokens: int


class ChosenVocabulary(TypedDict):
    held_out_coverage: dict[int, float]
    goal: float
    size: int


class ReproducedRecipe(TypedDict):
    """``recipe.json`` as :func:`eaglequant_examples.reproduce.reproduce` writes it."""

    data: RecipeFields
    train: RecipeFields
    target: dict[str, str]
    held_out_sets: Disjointness
    answers: ChunkedAnswers
    draft_vocabulary: ChosenVocabulary
    aux_layers: list[int]
    result: TrainResult
    timings: dict[str, float]
    code_commit: str


class PromptsTaken(TypedDict):
    taken: int
    kept: int
    answered: int
    ids_sha256: str
    rule: str


class AnswersFile(TypedDict):
    file: str
    sha256: str
    sequences: int
    tokens: int
    answer_tokens: int


class VocabularySize(TypedDict):
    size: int


class AcceleratedRecipe(TypedDict):
    """``recipe.json`` as :func:`eaglequant_examples.accelerated.recipe_record` writes it."""

    data: RecipeFields
    train: RecipeFields
    target: dict[str, str]
    prompts: PromptsTaken
    held_out_sets: Disjointness
    answers: AnswersFile
    draft_vocabulary: VocabularySize
    aux_layers: list[int]
    result: TrainResult
    machine: str
    torch: str
    timings: dict[str, float]
    code_commit: str


class AcceptanceRow(TypedDict):
    """Acceptance pooled over some prompts: verify steps, accepted drafts, mean length, rates."""

    drafts: int
    accepted: int
    mean_acceptance_length: float
    acceptance_by_position: list[float]


class CategoryAcceptance(AcceptanceRow):
    prompts: int


class SetAcceptance(AcceptanceRow):
    """One prompt set's acceptance, its interval, and its categories'."""

    interval_95: list[float]
    prompts: int
    sha256: str
    generated_tokens: int
    seconds: float
    categories: dict[str, CategoryAcceptance]
    workload: WorkloadJson  # what the acceptance was measured on (eaglequant.results.workload)


class AcceptanceMeasure(TypedDict):
    """The acceptance measure's result, by prompt set."""

    k: int
    max_tokens: int
    greedy: bool
    chat_template: bool
    sets: dict[str, SetAcceptance]


class ConversionRow(TypedDict):
    """One prompt's greedy tokens from vLLM (the converted target) and from the GGUF."""

    prompt: str
    vllm: list[int]
    gguf: list[int]
    first_difference: int | None
    gguf_margin_there: float | None
    agrees: bool


class ConversionCheck(TypedDict):
    max_tokens: int
    tie_margin: float
    prompts: list[ConversionRow]
