"""The draft's recipe on a lent accelerator: answers, states and training in one process.

The CPU recipe (:mod:`eaglequant_examples.reproduce`) generates the target's
answers with vLLM and caches the states as files. An accelerator here has torch
and transformers but no vLLM, and a bounded lease. So this module:

- converts the pinned GGUF exactly as ``eaglequant example smollm2`` does, and
  proves the weights equal the CPU conversion's (a digest over every tensor);
- generates the target's greedy answers with transformers
  (:mod:`eaglequant_examples.answers`);
- keeps every sequence's auxiliary states in accelerator memory;
- sizes the epochs to the time left (measured on a few throwaway steps; it
  overestimates, since a batch shape's first steps and the final checkpoint are
  in the probe), or takes the recipe's, then trains with
  :func:`eaglequant_examples.train_draft.train` on the device (with
  ``held_out``, the epoch kept is the one that predicts held-out answers best).

What it chose (prompts answered, epochs) goes into its summary, so the recipe
that ``recipe.json`` records is fixed numbers, not a time budget. Outputs:
``answers.safetensors`` (flat answer ids and offsets), the BF16 draft folder
and ``summary.json``. ``python -m eaglequant_examples.accelerated`` runs it.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import math
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from eaglequant_examples import train_draft as td
from eaglequant_examples.answers import answer, prepare_prompts, unpack_ids
from eaglequant_examples.records import (
    AcceleratedRecipe,
    AnswersTrained,
    LeaseSummary,
    PreparedPrompts,
)
from eaglequant_examples.selfdistill import DataRecipe

Log = Callable[[str], None]
ANSWERS_FILE = "answers.safetensors"
PROMPTS_FILE = "prompts.safetensors"
RECIPE_FILE = "recipe.json"
PROMPT_RULE = (
    "ShareGPT from `start`, `prompts` of them, less any sharing a run of 8 words with MT-Bench "
    "or HumanEval, then those whose chat-rendered tokens fit train.max_prompt_tokens; the first "
    "`answered` of those are answered"
)
GENERATOR = "transformers"  # DataRecipe.generator for this module's answers
FEATURE_BATCH_TOKENS = 65536  # padded tokens per target forward for the states
SUMMARY_FILE = "summary.json"


def weights_digest(state: dict[str, torch.Tensor]) -> str:
    """sha256 over every tensor's name, dtype, shape and bytes, in name order."""
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().contiguous().cpu()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


@torch.no_grad()
def device_features(
    model: Any,
    sequences: list[td.Sequence],
    aux_layers: tuple[int, ...],
    batch_tokens: int,
) -> list[torch.Tensor]:
    """Each sequence's auxiliary states (len, 3*hidden), BF16, kept on the model's device.

    Right-padded batches of similar length: with causal attention a sequence's
    states do not depend on the padding after it.
    """
    device = next(model.parameters()).device
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i].ids))
    features: list[torch.Tensor | None] = [None] * len(sequences)
    start = 0
    while start < len(order):
        end = start + 1
        while end < len(order) and (end - start + 1) * len(sequences[order[end]].ids) <= (
            batch_tokens
        ):
            end += 1
        group = order[start:end]
        width = max(len(sequences[i].ids) for i in group)
        ids = torch.zeros((len(group), width), dtype=torch.long)
        mask = torch.zeros((len(group), width), dtype=torch.long)
        for row, i in enumerate(group):
            n = len(sequences[i].ids)
            ids[row, :n], mask[row, :n] = sequences[i].ids, 1
        out = model.model(
            input_ids=ids.to(device), attention_mask=mask.to(device), output_hidden_states=True
        )
        stacked = torch.cat([out.hidden_states[k] for k in aux_layers], -1).bfloat16()
        for row, i in enumerate(group):
            features[i] = stacked[row, : len(sequences[i].ids)].clone()
        start = end
    return [f for f in features if f is not None]


def epochs_for(
    draft: td.Eagle3Draft,
    embed: torch.nn.Embedding,
    sequences: list[td.Sequence],
    features: list[torch.Tensor],
    recipe: td.TrainRecipe,
    seconds: float,
    work: Path,
    log: Log,
) -> int:
    """How many epochs fit in ``seconds``: a few throwaway steps on a copy, timed."""
    probe_dir = work / "probe"
    shutil.rmtree(probe_dir, ignore_errors=True)
    probe_dir.mkdir(parents=True)
    lengths = [len(s.ids) for s in sequences]
    groups = td.batches(lengths, recipe.batch_tokens, random.Random(recipe.seed))
    steps = min(12, len(groups))
    chosen = [i for g in groups[:steps] for i in g]
    subset = [sequences[i] for i in chosen]
    sub_features = [features[i] for i in chosen]
    probe = replace(recipe, epochs=1, checkpoint_every=10**9, warmup_steps=1)
    warm = [sequences[i] for i in groups[0]], [features[i] for i in groups[0]]
    td.train(copy.deepcopy(draft), embed, *warm, probe, probe_dir / "warm", lambda _m: None)
    _synchronize()
    began = time.monotonic()
    td.train(copy.deepcopy(draft), embed, subset, sub_features, probe, probe_dir, lambda _m: None)
    _synchronize()
    per_token = (time.monotonic() - began) / sum(len(s.ids) for s in subset)
    epoch_s = per_token * sum(lengths)
    epochs = max(1, min(recipe.epochs, math.floor(seconds / epoch_s)))
    log(f"one epoch: about {epoch_s:.0f} s (probe of {steps} steps); {epochs} epochs fit")
    shutil.rmtree(probe_dir, ignore_errors=True)
    return epochs


def _synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def load_target(target: Path, device: torch.device) -> tuple[Any, Any, str]:
    """The BF16 target on ``device`` (frozen), its tokenizer, and :func:`weights_digest`."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    model: Any = LlamaForCausalLM.from_pretrained(target, dtype=torch.bfloat16)
    model = model.to(device).eval()
    model.requires_grad_(False)
    return model, AutoTokenizer.from_pretrained(target), weights_digest(model.state_dict())


def train_from_answers(
    model: Any,
    prompts: list[list[int]],
    answers: list[list[int]],
    train: td.TrainRecipe,
    work: Path,
    log: Log,
    seconds: float | None = None,
) -> tuple[td.Eagle3Draft, dict[str, Any], td.TrainRecipe, AnswersTrained]:
    """The draft trained on ``model``'s device: the trained draft, its config, the recipe as
    trained (epochs fitted to ``seconds`` when given) and a summary with timings."""
    from eaglequant.rules.target_fit import default_aux_layers

    device = next(model.parameters()).device
    sequences = [
        td.Sequence(torch.tensor(p + a, dtype=torch.long), len(p))
        for p, a in zip(prompts, answers, strict=False)
        if len(p) <= train.max_prompt_tokens and len(a) >= 2
    ]
    aux = default_aux_layers(model.config.num_hidden_layers)
    mark = time.monotonic()
    features = device_features(model, sequences, aux, FEATURE_BATCH_TOKENS)
    timings = {"features_s": round(time.monotonic() - mark, 1)}
    torch.manual_seed(train.seed)
    fit, _ = td.split_held_out(len(sequences), train)  # the vocabulary sees no held-out answer
    vocabulary = td.draft_vocabulary([sequences[i] for i in fit], train.draft_vocab)
    draft, config = td.build_draft(model, vocabulary, aux, train)
    draft.to(device)
    embed = model.model.embed_tokens
    if seconds is not None:
        epochs = epochs_for(draft, embed, sequences, features, train, seconds, work, log)
        train = replace(train, epochs=epochs)
    mark = time.monotonic()
    result = td.train(draft, embed, sequences, features, train, work / "train", log)
    timings["train_s"] = round(time.monotonic() - mark, 1)
    summary: AnswersTrained = {
        "sequences": len(sequences),
        "tokens": sum(len(s.ids) for s in sequences),
        "answer_tokens": sum(len(s.ids) - s.answer_start for s in sequences),
        "aux_layers": list(aux),
        "result": result,
        "timings": timings,
    }
    return draft.cpu(), config, train, summary


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def run(args: argparse.Namespace, log: Log) -> LeaseSummary:
    """The lease's run: convert the GGUF, answer until ``--generate-seconds``, train."""
    from safetensors.torch import load_file

    from eaglequant_examples.smollm2 import convert
    from eaglequant_examples.toy import save_draft

    began = time.monotonic()
    out, work = Path(args.out), Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    target = work / "target"
    if not (target / "config.json").is_file():
        convert(Path(args.gguf), target)
    model, tokenizer, digest = load_target(target, device)
    log(f"target weights digest {digest} (expected {args.weights_digest})")
    data = DataRecipe(max_answer_tokens=args.answer_tokens, chunk=args.chunk, generator=GENERATOR)
    prompts = unpack_ids(load_file(args.prompts))
    answers_path = out / ANSWERS_FILE
    if args.answered:
        shutil.copyfile(args.answered, answers_path)
    mark = time.monotonic()
    deadline = mark + args.generate_seconds
    answers = answer(model, tokenizer, prompts, data, answers_path, deadline, log)
    generate_s = round(time.monotonic() - mark, 1)
    train = td.TrainRecipe(**json.loads(args.train_recipe))
    left = args.deadline_seconds - (time.monotonic() - began) - args.reserve_seconds
    seconds = None if args.fixed_epochs else left * 0.9
    draft, config, train, trained = train_from_answers(
        model, prompts, answers, train, work, log, seconds
    )
    save_draft(out / "draft", draft, config)
    summary: LeaseSummary = {
        "device": device_name(device),
        "torch": torch.__version__,
        "target_weights_digest": digest,
        "prompts_answered": len(answers),
        "max_answer_tokens": args.answer_tokens,
        "train": asdict(train),
        **trained,
    }
    summary["timings"] |= {"generate_s": generate_s, "total_s": round(time.monotonic() - began, 1)}
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def reproduce_on_device(
    *,
    target: Path,
    work: Path,
    out: Path,
    data: DataRecipe,
    train: td.TrainRecipe,
    device: str,
    log: Log,
) -> AcceleratedRecipe:
    """A ``generator: transformers`` recipe end to end (every stage resumes from ``work``):
    the draft and ``recipe.json`` in ``out``."""
    from safetensors.torch import load_file

    from eaglequant_examples.toy import save_draft

    began = time.monotonic()
    work.mkdir(parents=True, exist_ok=True)
    prepared = prepare_prompts(data, target, train.max_prompt_tokens, work / PROMPTS_FILE)
    prompts = unpack_ids(load_file(str(work / PROMPTS_FILE)))[: data.answered or None]
    model, tokenizer, digest = load_target(target, torch.device(device))
    mark = time.monotonic()
    answers = answer(model, tokenizer, prompts, data, work / ANSWERS_FILE, math.inf, log)
    generate_s = round(time.monotonic() - mark, 1)
    draft, config, train, summary = train_from_answers(model, prompts, answers, train, work, log)
    save_draft(out, draft, config)
    summary["timings"] |= {"generate_s": generate_s, "total_s": round(time.monotonic() - began, 1)}
    record = recipe_record(
        target=target,
        data=data,
        train=train,
        prepared=prepared,
        answers_file=work / ANSWERS_FILE,
        digest=digest,
        summary=summary,
        machine=device_name(torch.device(device)),
    )
    (out / RECIPE_FILE).write_text(json.dumps(record, indent=2) + "\n")
    return record


def recipe_record(
    *,
    target: Path,
    data: DataRecipe,
    train: td.TrainRecipe,
    prepared: PreparedPrompts,
    answers_file: Path,
    digest: str,
    summary: AnswersTrained,
    machine: str,
) -> AcceleratedRecipe:
    """What ``recipe.json`` holds for a draft made by this module."""
    from eaglequant.io.packaged import file_sha256
    from eaglequant_examples.reproduce import code_commit, target_record

    return {
        "data": asdict(data),
        "train": asdict(train),
        "target": target_record(target) | {"weights_digest": digest},
        "prompts": {
            "taken": prepared["prompts"],
            "kept": prepared["kept"],
            "answered": data.answered or prepared["kept"],
            "ids_sha256": prepared["sha256"],
            "rule": PROMPT_RULE,
        },
        "held_out_sets": prepared["held_out_sets"],
        "answers": {
            "file": answers_file.name,
            "sha256": file_sha256(answers_file),
            "sequences": summary["sequences"],
            "tokens": summary["tokens"],
            "answer_tokens": summary["answer_tokens"],
        },
        "draft_vocabulary": {"size": train.draft_vocab},
        "aux_layers": summary["aux_layers"],
        "result": summary["result"],
        "machine": machine,
        "torch": torch.__version__,
        "timings": summary["timings"],
        "code_commit": code_commit(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", required=True)
    parser.add_argument("--prompts", required=True, help="pack_ids safetensors of prompt ids")
    parser.add_argument("--out", required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--weights-digest", default="")
    parser.add_argument("--answer-tokens", type=int, default=512)
    parser.add_argument("--chunk", type=int, default=1024)
    parser.add_argument("--generate-seconds", type=float, default=200.0)
    parser.add_argument("--deadline-seconds", type=float, default=540.0)
    parser.add_argument("--reserve-seconds", type=float, default=30.0)
    parser.add_argument("--answered", default="", help="answers already made for the first prompts")
    parser.add_argument(
        "--fixed-epochs", action="store_true", help="train the recipe's epochs (no time probe)"
    )
    parser.add_argument("--train-recipe", default="{}", help="TrainRecipe fields as JSON")
    args = parser.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    log_file = Path(args.out) / "log.txt"

    def log(message: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')}] {message}"
        print(line, flush=True)
        with log_file.open("a") as handle:
            handle.write(line + "\n")

    run(args, log)


if __name__ == "__main__":
    main()
