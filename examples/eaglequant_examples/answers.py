"""The target's own greedy answers with transformers, on any device, and the prompts they answer.

:mod:`eaglequant_examples.selfdistill` answers with vLLM (the CPU recipe); an
accelerator lent here has no vLLM, so :mod:`eaglequant_examples.accelerated`
answers with this module: left-padded batches, a chunk of prompts at a time in
the prompts' order, each answer cut after its first end-of-turn token (vLLM's
answers keep that token too). Prompt and answer ids travel and are cached as
safetensors (a flat id tensor and offsets), never as pickles.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from eaglequant_examples.records import PreparedPrompts
from eaglequant_examples.selfdistill import DataRecipe

Log = Callable[[str], None]


def pack_ids(rows: list[list[int]]) -> dict[str, torch.Tensor]:
    """Token-id lists as one flat int32 tensor and their offsets (safetensors, no pickles)."""
    lengths = torch.tensor([0] + [len(r) for r in rows], dtype=torch.long)
    flat = [t for r in rows for t in r]
    return {"ids": torch.tensor(flat, dtype=torch.int32), "offsets": lengths.cumsum(0)}


def unpack_ids(tensors: dict[str, torch.Tensor]) -> list[list[int]]:
    ids, offsets = tensors["ids"].tolist(), tensors["offsets"].tolist()
    return [ids[a:b] for a, b in itertools.pairwise(offsets)]


def cut_answer(tokens: list[int], stop_ids: set[int]) -> list[int]:
    """The answer up to and including its first stop token (vLLM keeps that token)."""
    for i, token in enumerate(tokens):
        if token in stop_ids:
            return tokens[: i + 1]
    return tokens


@torch.no_grad()
def generate_answers(
    model: Any,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    stop_ids: set[int],
    pad_id: int,
) -> list[list[int]]:
    """Greedy answers to ``prompts`` as one left-padded batch."""
    device = next(model.parameters()).device
    width = max(len(r) for r in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, r in enumerate(prompts):  # left padding
        ids[i, width - len(r) :] = torch.tensor(r)
        mask[i, width - len(r) :] = 1
    out = model.generate(
        input_ids=ids.to(device),
        attention_mask=mask.to(device),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=pad_id,
        eos_token_id=sorted(stop_ids),
    )
    return [cut_answer(r, stop_ids) for r in out[:, width:].tolist()]


def answer(
    model: Any,
    tokenizer: Any,
    prompts: list[list[int]],
    data: DataRecipe,
    answers_path: Path,
    deadline: float,
    log: Log,
) -> list[list[int]]:
    """Greedy answers to ``prompts``: those in ``answers_path`` are kept, the rest generated
    a chunk at a time while the last chunk's time still fits before ``deadline``, the file
    rewritten after each chunk."""
    from safetensors.torch import load_file, save_file

    answers = unpack_ids(load_file(str(answers_path))) if answers_path.is_file() else []
    stop_ids = {int(tokenizer.eos_token_id)}
    pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
    last = 0.0
    while len(answers) < len(prompts) and time.monotonic() + last <= deadline:
        began = time.monotonic()
        chunk = prompts[len(answers) : len(answers) + data.chunk]
        new = generate_answers(
            model, chunk, max_new_tokens=data.max_answer_tokens, stop_ids=stop_ids, pad_id=pad_id
        )
        answers += new
        partial = answers_path.with_suffix(".partial")
        save_file(pack_ids(answers), str(partial))
        partial.rename(answers_path)
        last = time.monotonic() - began
        tokens = sum(len(a) for a in new)
        log(f"{len(answers)}/{len(prompts)} prompts answered ({tokens} tokens in {last:.1f} s)")
    return answers


def prepare_prompts(
    data: DataRecipe, target: Path, max_prompt_tokens: int, out: Path
) -> PreparedPrompts:
    """The recipe's training prompts, rendered through the target's chat template and
    tokenized as vLLM's chat endpoint does, those over ``max_prompt_tokens`` left out;
    written with :func:`pack_ids`. Refuses prompts that overlap MT-Bench or HumanEval."""
    from safetensors.torch import save_file
    from transformers import AutoTokenizer

    from eaglequant.io.packaged import file_sha256
    from eaglequant.prompts.chat import render
    from eaglequant_examples.selfdistill import (
        disjointness,
        held_out_sets,
        training_prompts,
        without_overlap,
    )

    held_out = held_out_sets()
    texts, left_out = without_overlap(training_prompts(data), held_out)
    overlap = disjointness(texts, held_out) | {"left_out_overlapping": left_out}
    tokenizer = AutoTokenizer.from_pretrained(target)
    rendered = render(texts, tokenizer, use_template=True)
    encoded = tokenizer(rendered.texts, add_special_tokens=rendered.add_special_tokens)
    rows = [list(r) for r in encoded["input_ids"] if len(r) <= max_prompt_tokens]
    save_file(pack_ids(rows), str(out))
    return {
        "prompts": len(texts),
        "kept": len(rows),
        "sha256": file_sha256(out),
        "held_out_sets": overlap,
    }
