"""How well BF16 EAGLE-3 drafts predict a target's own greedy answers, without vLLM.

    python bench/teacher_forced_bench.py TARGET DRAFT [DRAFT ...] [--sets mt-bench,humaneval] \
        [--max-tokens 256] [--out bench/results-teacher-forced-smollm2.json]

The target (transformers, BF16, on the CPU) answers each set's prompts greedily through
its chat template (cached under ``build/teacher-forced``, keyed by target, set and
length). Each draft then predicts every answer token the way training measures it
(:func:`eaglequant_examples.train_draft.held_out_top1`: the correct tokens fed in as vLLM
feeds accepted ones, a token outside the draft vocabulary a miss), by unrolled step, with
1 + p1 + p1*p2 + ... beside it. It tells a draft that generalizes badly from a serving
path that disagrees with training: vLLM's position-1 rate on the same set should sit a
little under step 1's top-1 (verify steps start more often where a draft just failed).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import time
from pathlib import Path
from typing import Any

import torch

from eaglequant_examples import train_draft as td
from eaglequant_examples.accelerated import device_features
from eaglequant_examples.answers import generate_answers

CACHE = Path(__file__).resolve().parent.parent / "build" / "teacher-forced"
BATCH = 16  # prompts answered together (left-padded)


def load_draft(folder: Path) -> td.Eagle3Draft:
    from transformers import LlamaConfig

    from eaglequant.io.checkpoint import read_checkpoint

    checkpoint = read_checkpoint(folder)
    draft = td.Eagle3Draft(LlamaConfig(**checkpoint.config), with_embeddings=False)
    state = {n: checkpoint.load_tensor(n) for n in checkpoint.tensors}
    draft.load_state_dict({n: t.float() if t.is_floating_point() else t for n, t in state.items()})
    return draft.eval()


def answers_for(
    model: Any, tokenizer: Any, name: str, max_tokens: int
) -> tuple[list[list[int]], list[list[int]]]:
    """The set's rendered prompt ids and the target's greedy answers to them (cached)."""
    from eaglequant.prompts.chat import render
    from eaglequant.prompts.source import load_prompts, parse_source

    texts = [p.text for p in load_prompts(parse_source(name)).prompts]
    rendered = render(texts, tokenizer, True).texts
    prompts = [tokenizer(r, add_special_tokens=False)["input_ids"] for r in rendered]
    key = hashlib.sha256(json.dumps([model.config.to_dict(), prompts, max_tokens]).encode())
    path = CACHE / f"{name}-{key.hexdigest()[:16]}.json"
    if path.is_file():
        return prompts, json.loads(path.read_text())
    stop = {tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.eos_token_id} - {None}
    pad = tokenizer.pad_token_id or 0
    answers: list[list[int]] = []
    for start in range(0, len(prompts), BATCH):
        chunk = prompts[start : start + BATCH]
        answers += generate_answers(
            model, chunk, max_new_tokens=max_tokens, stop_ids=stop, pad_id=pad
        )
    CACHE.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(answers))
    return prompts, answers


def main() -> None:
    from transformers import AutoTokenizer, LlamaForCausalLM

    parser = argparse.ArgumentParser()
    parser.add_argument("target", type=Path)
    parser.add_argument("drafts", type=Path, nargs="+")
    parser.add_argument("--sets", default="mt-bench,humaneval")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    model = LlamaForCausalLM.from_pretrained(args.target, dtype=torch.bfloat16).eval()
    model.requires_grad_(False)
    report: dict[str, Any] = {
        "max_tokens": args.max_tokens,
        "sets": {},
        "machine": platform.machine(),
    }
    for name in args.sets.split(","):
        began = time.monotonic()
        prompts, answers = answers_for(model, tokenizer, name, args.max_tokens)
        sequences = [
            td.Sequence(torch.tensor(p + a), len(p)) for p, a in zip(prompts, answers, strict=True)
        ]
        rows: dict[str, Any] = {}
        states: dict[tuple[int, ...], list[torch.Tensor]] = {}
        for folder in args.drafts:
            draft = load_draft(folder)
            aux = tuple(draft.config.eagle_aux_hidden_state_layer_ids)
            if aux not in states:  # drafts of one target share its states
                states[aux] = device_features(model, sequences, aux, 16384)
            features = states[aux]
            to_draft = torch.full((draft.dims.vocab,), -1, dtype=torch.long)
            ids = torch.arange(draft.dims.draft_vocab)
            to_draft[ids + draft.d2t] = ids
            recipe = td.TrainRecipe(batch_tokens=16384)
            embed = model.model.embed_tokens
            top1 = td.held_out_top1(draft, embed, sequences, features, to_draft, recipe)
            rows[str(folder)] = {
                "top1_by_step": [round(a, 4) for a in top1],
                "acceptance_proxy": round(td.acceptance_proxy(top1), 4),
            }
        answer_tokens = sum(len(a) for a in answers)
        report["sets"][name] = {"prompts": len(prompts), "answer_tokens": answer_tokens} | {
            "drafts": rows,
            "seconds": round(time.monotonic() - began, 1),
        }
        print(name, json.dumps(rows), flush=True)
    if args.out:  # each set's rows were printed as they came
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
