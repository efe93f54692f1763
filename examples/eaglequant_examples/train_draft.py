"""Train an EAGLE-3 draft on the target's own answers, with training-time-test unrolling.

The data are :mod:`eaglequant_examples.selfdistill`'s chunks: prompt and
greedy-answer token ids. The target (transformers, BF16) runs once over every
sequence for its auxiliary hidden states (vLLM's default layers for its depth),
kept as BF16 safetensors files beside the data. The draft (``midlayer``,
``fc``, ``norm``, ``lm_head`` over a draft vocabulary of the answers' most
frequent tokens) learns, at every answer position, the target's next greedy
tokens: step 0 from the target's states, steps 1.. from its own previous
states with the correct tokens fed in, each step's queries seeing the step-0
keys up to their base and their own earlier steps' keys, as vLLM's KV cache
holds them while it drafts. The labels are the answer's own tokens, which are
the target's argmax (it generated them greedily). The draft has no
``embed_tokens``: vLLM lends it the target's, and training uses the target's.

Checkpoints (weights and optimizer state as safetensors, never pickles) are
written every ``checkpoint_every`` steps; a rerun resumes from the last one.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from eaglequant.model.eagle3 import Eagle3Draft, scaled_init_
from eaglequant_examples.records import TrainResult
from eaglequant_examples.synthetic import draft_config

Log = Callable[[str], None]
FEATURES_PREFIX = "features-"
CHECKPOINT = "checkpoint.safetensors"
CHECKPOINT_STATE = "checkpoint.json"


@dataclass(frozen=True, kw_only=True)
class TrainRecipe:
    """The draft's shape and the training's budget."""

    draft_vocab: int = 16384
    max_prompt_tokens: int = 768
    ttt_steps: int = 3
    step_decay: float = 0.8  # step k's loss weight: decay**k
    epochs: int = 2
    batch_tokens: int = 4096
    lr: float = 1e-3
    warmup_steps: int = 40
    checkpoint_every: int = 50
    seed: int = 0
    threads: int = 2
    held_out: int = 0  # sequences kept out (seeded) to choose the epoch; 0: the last epoch


@dataclass(frozen=True)
class Sequence:
    ids: torch.Tensor  # prompt then answer, int64
    answer_start: int


def read_sequences(paths: list[Path], recipe: TrainRecipe) -> list[Sequence]:
    """Every answered prompt whose prompt fits ``max_prompt_tokens`` (the rest are skipped)."""
    sequences = []
    for path in paths:
        for line in path.read_text().splitlines():
            record = json.loads(line)
            prompt, answer = record["prompt"], record["answer"]
            if len(prompt) <= recipe.max_prompt_tokens and len(answer) >= 2:
                ids = torch.tensor(prompt + answer, dtype=torch.long)
                sequences.append(Sequence(ids, len(prompt)))
    return sequences


def vocabulary_coverage(
    train: list[Sequence], held_out: list[Sequence], sizes: list[int]
) -> dict[int, float]:
    """For each draft-vocabulary size: the share of ``held_out``'s answer tokens that the
    vocabulary chosen from ``train`` holds."""
    answers = torch.cat([s.ids[s.answer_start :] for s in held_out]).tolist()
    coverage = {}
    for n in sizes:
        vocabulary = set(draft_vocabulary(train, n).tolist())
        coverage[n] = round(sum(a in vocabulary for a in answers) / len(answers), 5)
    return coverage


def draft_vocabulary(sequences: list[Sequence], size: int) -> torch.Tensor:
    """The ``size`` most frequent answer token ids (ties by id), sorted."""
    counts = _answer_counts(sequences)
    order = sorted(range(len(counts)), key=lambda i: (-int(counts[i]), i))
    return torch.tensor(sorted(order[:size]), dtype=torch.long)


def _answer_counts(sequences: list[Sequence]) -> torch.Tensor:
    answers = torch.cat([s.ids[s.answer_start :] for s in sequences])
    return torch.bincount(answers, minlength=int(answers.max()) + 1)


def target_features(
    target: Any, sequences: list[Sequence], aux_layers: tuple[int, ...], work: Path, log: Log
) -> list[torch.Tensor]:
    """Each sequence's auxiliary states (len, 3*hidden) in BF16, cached in ``work``."""
    from safetensors.torch import load_file, save_file

    per_file = 256
    features: list[torch.Tensor] = []
    for start in range(0, len(sequences), per_file):
        path = work / f"{FEATURES_PREFIX}{start // per_file:05d}.safetensors"
        chunk = sequences[start : start + per_file]
        if not path.is_file():
            states = {str(i): _aux_states(target, s.ids, aux_layers) for i, s in enumerate(chunk)}
            save_file(states, str(path.with_suffix(".partial")))
            path.with_suffix(".partial").rename(path)
            log(f"{path.name}: {sum(len(s.ids) for s in chunk)} tokens")
        loaded = load_file(str(path))
        features += [loaded[str(i)] for i in range(len(chunk))]
    return features


@torch.no_grad()
def _aux_states(target: Any, ids: torch.Tensor, aux_layers: tuple[int, ...]) -> torch.Tensor:
    out = target.model(input_ids=ids[None], output_hidden_states=True)
    return torch.cat([out.hidden_states[i][0] for i in aux_layers], -1).bfloat16().contiguous()


def build_draft(
    target: Any, draft_ids: torch.Tensor, aux_layers: tuple[int, ...], recipe: TrainRecipe
) -> tuple[Eagle3Draft, dict[str, Any]]:
    """An untrained draft shaped after ``target``; ``lm_head`` starts from the target's rows."""
    from transformers import LlamaConfig

    tc = target.config
    config = draft_config(
        hidden=tc.hidden_size,
        heads=tc.num_attention_heads,
        kv_heads=tc.num_key_value_heads,
        intermediate=tc.intermediate_size,
        vocab=tc.vocab_size,
        draft_vocab=len(draft_ids),
        aux_layer_ids=aux_layers,
        target_hidden_size=tc.hidden_size,
        max_position_embeddings=tc.max_position_embeddings,
        rms_norm_eps=tc.rms_norm_eps,
        rope_theta=tc.rope_parameters["rope_theta"],
    )
    draft = Eagle3Draft(LlamaConfig(**config), with_embeddings=False)
    scaled_init_(draft, recipe.seed)
    with torch.no_grad():
        draft.lm_head.weight.copy_(target.lm_head.weight[draft_ids].float())
        draft.norm.weight.copy_(target.model.norm.weight.float())
        draft.d2t.copy_(draft_ids - torch.arange(len(draft_ids)))
        draft.t2d.zero_()
        draft.t2d[draft_ids] = True
    return draft, config


def batches(lengths: list[int], batch_tokens: int, rng: random.Random) -> list[list[int]]:
    """Indices grouped by similar length, each group's padded size at most ``batch_tokens``."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    groups: list[list[int]] = []
    current: list[int] = []
    for i in order:
        if current and (len(current) + 1) * lengths[i] > batch_tokens:
            groups.append(current)
            current = []
        current.append(i)
    if current:
        groups.append(current)
    rng.shuffle(groups)
    return groups


def _unrolled(
    draft: Eagle3Draft,
    embed: torch.nn.Embedding,
    aux: torch.Tensor,
    ids: torch.Tensor,
    lengths: torch.Tensor,
    answer_starts: torch.Tensor,
    to_draft: torch.Tensor,
    steps: int,
) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Each unrolled step's logits and draft-vocabulary labels at the answer positions whose
    label the draft vocabulary holds, and how many answer positions the step had (a tensor:
    training reads none, so it never waits for the device).

    ``ids`` (b, L + steps) padded; ``aux`` (b, L, fc_in); base position i's
    step k predicts the token at i+k+2, which counts where it lies in the answer.
    """
    b, t = aux.shape[0], aux.shape[1] - 1
    base = torch.arange(t, device=aux.device).expand(b, t)
    hidden = draft.fc(draft.fc_input(aux[:, :t].float()))
    caches: list[tuple[list[torch.Tensor], ...]] = [([], []) for _ in range(draft.dims.layers)]
    for k in range(steps):
        tokens = ids[:, k + 1 : k + 1 + t]
        out = draft._step(embed(tokens).float(), hidden, base + k, caches)
        position = base + k + 2
        labels = to_draft[ids[:, k + 2 : k + 2 + t]]
        answer = (position < lengths[:, None]) & (position >= answer_starts[:, None])
        valid = answer & (labels >= 0)
        yield draft.lm_head(draft.norm(out.prenorm[valid])), labels[valid], answer.sum()
        hidden = out.prenorm


def ttt_loss(
    draft: Eagle3Draft,
    embed: torch.nn.Embedding,
    aux: torch.Tensor,
    ids: torch.Tensor,
    lengths: torch.Tensor,
    answer_starts: torch.Tensor,
    to_draft: torch.Tensor,
    recipe: TrainRecipe,
) -> tuple[torch.Tensor, list[float]]:
    """The weighted loss over the unrolled steps and each step's top-1 accuracy (over the
    answer tokens the draft vocabulary holds)."""
    total: torch.Tensor = torch.zeros((), device=aux.device)
    accuracy = []
    batch = (aux, ids, lengths, answer_starts)
    for k, (logits, target, _) in enumerate(
        _unrolled(draft, embed, *batch, to_draft, recipe.ttt_steps)
    ):
        total = total + recipe.step_decay**k * F.cross_entropy(logits.float(), target)
        accuracy.append((logits.argmax(-1) == target).float().mean())
    return total, [float(a) for a in torch.stack(accuracy).tolist()]


@torch.no_grad()
def held_out_top1(
    draft: Eagle3Draft,
    embed: torch.nn.Embedding,
    sequences: list[Sequence],
    features: list[torch.Tensor],
    to_draft: torch.Tensor,
    recipe: TrainRecipe,
) -> list[float]:
    """Each unrolled step's top-1 over every answer token of ``sequences`` (a token outside
    the draft vocabulary is a miss), the correct tokens fed in as vLLM feeds accepted ones."""
    hits, seen = [0] * recipe.ttt_steps, [0] * recipe.ttt_steps
    was_training = draft.training
    draft.eval()
    device = draft.fc.weight.device
    for group in batches([len(s.ids) for s in sequences], recipe.batch_tokens, random.Random(0)):
        batch = _collate(group, sequences, features, recipe.ttt_steps)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            for k, (logits, target, answer) in enumerate(
                _unrolled(draft, embed, *batch, to_draft, recipe.ttt_steps)
            ):
                hits[k] += int((logits.argmax(-1) == target).sum())
                seen[k] += int(answer)
    draft.train(was_training)
    return [h / max(1, n) for h, n in zip(hits, seen, strict=True)]


def acceptance_proxy(top1: list[float]) -> float:
    """1 + p1 + p1*p2 + ...: the mean acceptance length if the steps' hits were independent."""
    length, chain = 1.0, 1.0
    for p in top1:
        chain *= p
        length += chain
    return length


def _collate(
    group: list[int], sequences: list[Sequence], features: list[torch.Tensor], steps: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One padded batch, on the features' device."""
    device = features[group[0]].device
    length = max(len(sequences[i].ids) for i in group)
    ids = torch.zeros(len(group), length + steps + 1, dtype=torch.long)
    aux = torch.zeros(
        len(group), length, features[group[0]].shape[-1], dtype=torch.bfloat16, device=device
    )
    for row, i in enumerate(group):
        n = len(sequences[i].ids)
        ids[row, :n] = sequences[i].ids
        aux[row, :n] = features[i]
    lengths = torch.tensor([len(sequences[i].ids) for i in group])
    starts = torch.tensor([sequences[i].answer_start for i in group])
    return aux, ids.to(device), lengths.to(device), starts.to(device)


def split_held_out(count: int, recipe: TrainRecipe) -> tuple[list[int], list[int]]:
    """The indices trained on and the ``recipe.held_out`` kept out (seeded), each sorted."""
    kept_out = set(random.Random(recipe.seed).sample(range(count), min(recipe.held_out, count)))
    return [i for i in range(count) if i not in kept_out], sorted(kept_out)


@torch.enable_grad()  # whatever the caller's grad mode (vLLM and Quark turn it off globally)
def train(
    draft: Eagle3Draft,
    embed: torch.nn.Embedding,
    sequences: list[Sequence],
    features: list[torch.Tensor],
    recipe: TrainRecipe,
    work: Path,
    log: Log,
) -> TrainResult:
    """Train ``draft`` in place (resuming from ``work``'s checkpoint); returns the run's summary.

    Runs on the draft's device (the features must be there too), in BF16 autocast.
    With ``recipe.held_out``, that many sequences are kept out of training; after
    each epoch their per-step top-1 is measured, and the draft ends with the
    weights of the epoch whose :func:`acceptance_proxy` was highest.
    """
    device = draft.fc.weight.device
    to_draft = torch.full((draft.dims.vocab,), -1, dtype=torch.long, device=device)
    draft_ids = torch.arange(draft.dims.draft_vocab, device=device) + draft.d2t
    to_draft[draft_ids] = torch.arange(draft.dims.draft_vocab, device=device)
    params = [p for p in draft.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=recipe.lr, weight_decay=0.0, betas=(0.9, 0.95))
    fit, kept_out = split_held_out(len(sequences), recipe)
    held = [sequences[i] for i in kept_out], [features[i] for i in kept_out]
    sequences, features = [sequences[i] for i in fit], [features[i] for i in fit]
    epochs = [
        batches(
            [len(s.ids) for s in sequences], recipe.batch_tokens, random.Random(recipe.seed + epoch)
        )
        for epoch in range(recipe.epochs)
    ]
    plan = [group for groups in epochs for group in groups]
    epoch_ends = {sum(len(g) for g in epochs[: e + 1]) for e in range(len(epochs))}
    work.mkdir(parents=True, exist_ok=True)
    done, best = _resume(draft, optimizer, work)
    started, smoothed = time.monotonic(), [float("nan")] * recipe.ttt_steps
    draft.train()
    for step in range(done, len(plan)):
        for group in optimizer.param_groups:
            group["lr"] = recipe.lr * _schedule(step, len(plan), recipe.warmup_steps)
        batch = _collate(plan[step], sequences, features, recipe.ttt_steps)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss, accuracy = ttt_loss(draft, embed, *batch, to_draft=to_draft, recipe=recipe)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        pairs = zip(smoothed, accuracy, strict=True)
        smoothed = [a if step == done else 0.95 * s + 0.05 * a for s, a in pairs]
        if (step + 1) % 10 == 0:
            rate = (step + 1 - done) / (time.monotonic() - started)
            shown = ", ".join(f"{a:.3f}" for a in smoothed)
            log(
                f"step {step + 1}/{len(plan)}: loss {loss.item():.3f}, top-1 by step {shown}, "
                f"{rate:.2f} steps/s"
            )
        if held[0] and step + 1 in epoch_ends:
            top1 = held_out_top1(draft, embed, *held, to_draft, recipe)
            best = _record_epoch(best, draft, top1)
            shown = ", ".join(f"{a:.4f}" for a in top1)
            log(f"epoch {len(best.by_epoch)}: held-out top-1 by step {shown}")
        if (step + 1) % recipe.checkpoint_every == 0 or step + 1 == len(plan):
            _checkpoint(draft, optimizer, step + 1, best, work)
    summary: TrainResult = {
        "steps": len(plan),
        "top1_by_step_smoothed": [round(a, 4) for a in smoothed],
    }
    if held[0]:
        draft.load_state_dict(best.weights)
        summary["held_out"] = {
            "sequences": len(held[0]),
            "top1_by_step_by_epoch": best.by_epoch,
            "chosen_epoch": best.epoch,
        }
        log(f"kept epoch {best.epoch} of {len(epochs)} (held-out acceptance proxy)")
    return summary


@dataclass(frozen=True)
class Best:
    """The held-out record: every epoch's top-1 by step, the best epoch (1-based; 0: none
    yet) and its weights."""

    by_epoch: list[list[float]]
    epoch: int = 0
    weights: dict[str, torch.Tensor] = field(default_factory=dict)


def _record_epoch(best: Best, draft: Eagle3Draft, top1: list[float]) -> Best:
    """``best`` with this epoch's held-out top-1 added, and its weights if it is the best."""
    by_epoch = [*best.by_epoch, [round(a, 4) for a in top1]]
    if best.epoch and acceptance_proxy(top1) <= acceptance_proxy(best.by_epoch[best.epoch - 1]):
        return replace(best, by_epoch=by_epoch)
    weights = {k: v.detach().cpu().clone() for k, v in draft.state_dict().items()}
    return Best(by_epoch, len(by_epoch), weights)


def _schedule(step: int, steps: int, warmup: int) -> float:
    """Linear warm-up, then cosine decay to a tenth."""
    return min(1.0, (step + 1) / warmup) * (0.1 + 0.45 * (1 + math.cos(math.pi * step / steps)))


def _checkpoint(draft: Eagle3Draft, optimizer: Any, step: int, best: Best, work: Path) -> None:
    from safetensors.torch import save_file

    tensors = {f"model.{k}": v.contiguous() for k, v in draft.state_dict().items()}
    tensors |= {f"best.{k}": v.contiguous() for k, v in best.weights.items()}
    names = {id(p): n for n, p in draft.named_parameters()}
    for group in optimizer.param_groups:
        for p in group["params"]:
            for key, value in optimizer.state.get(p, {}).items():
                if torch.is_tensor(value):
                    tensors[f"optim.{names[id(p)]}.{key}"] = value.contiguous()
    partial = work / (CHECKPOINT + ".partial")
    save_file(tensors, str(partial))
    partial.rename(work / CHECKPOINT)
    state = {"step": step, "best_epoch": best.epoch, "by_epoch": best.by_epoch}
    (work / CHECKPOINT_STATE).write_text(json.dumps(state) + "\n")


def _resume(draft: Eagle3Draft, optimizer: Any, work: Path) -> tuple[int, Best]:
    """The steps done and the held-out record (best epoch, its weights, every epoch's top-1)."""
    from safetensors.torch import load_file

    if not (work / CHECKPOINT_STATE).is_file():
        return 0, Best([])
    state = json.loads((work / CHECKPOINT_STATE).read_text())
    tensors = load_file(str(work / CHECKPOINT))
    draft.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
    best = Best(
        state.get("by_epoch", []),
        state.get("best_epoch", 0),
        {k[5:]: v for k, v in tensors.items() if k.startswith("best.")},
    )
    for name, p in draft.named_parameters():
        prefix = f"optim.{name}."
        state_p = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
        if state_p:  # AdamW keeps its step count on the CPU
            optimizer.state[p] = {
                k: v if k == "step" else v.to(p.device) for k, v in state_p.items()
            }
    return int(state["step"]), best
