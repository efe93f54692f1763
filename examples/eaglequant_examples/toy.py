"""Generate the embedded toy pair: a small trained Llama target and its EAGLE-3 draft.

Everything comes from what every machine here has: the corpus is this Python's
standard library (``.py`` files, sorted, a fixed hash split into train and
held-out), a byte-level BPE tokenizer is trained on it with ``tokenizers``, a
4-layer Llama target is trained on CPU, and an EAGLE-3 draft is trained on the
target's auxiliary hidden states with multi-step (training-time-test) unrolling,
against the target's own next-token distribution. Seeded throughout; the same
Python version gives the same corpus.
"""

from __future__ import annotations

import hashlib
import json
import sysconfig
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from eaglequant_examples.synthetic import draft_config, write_draft

AUX_LAYER_IDS = (1, 2, 3)


@dataclass(frozen=True)
class ToySettings:
    """Sizes and budgets of the toy pair (defaults: the committed pair)."""

    seed: int = 0
    vocab: int = 2048
    draft_vocab: int = 1024
    hidden: int = 256
    layers: int = 4
    heads: int = 8
    kv_heads: int = 4
    intermediate: int = 768
    seq_len: int = 128
    batch: int = 16
    target_steps: int = 800
    draft_train_steps: int = 900
    draft_steps: int = 3
    threads: int = 2
    prompts: int = 32
    norm_before_residual: bool = False  # the draft's forward variant (vLLM's llama_eagle3)


class DraftSummary(TypedDict):
    """``make_draft.json``: what the draft was trained for, its loss, the time, the settings."""

    target: str
    draft_loss: float
    seconds: float
    settings: dict[str, int | bool]  # ToySettings' fields


class PairSummary(TypedDict):
    """``make_pair.json``: the corpus, both losses, the time and the settings."""

    train_files: int
    train_tokens: int
    target_loss: float
    draft_loss: float
    seconds: float
    settings: dict[str, int | bool]


def corpus_files(held_out: bool) -> list[Path]:
    """The standard library's .py files, sorted; 1 in 10 (by name hash) is held out."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        p for p in lib.rglob("*.py") if "site-packages" not in p.parts and "test" not in p.parts
    )
    return [p for p in files if (_bucket(p.relative_to(lib)) == 0) == held_out]


def _bucket(rel: Path) -> int:
    return int(hashlib.sha256(str(rel).encode()).hexdigest(), 16) % 10


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def train_tokenizer(files: list[Path], settings: ToySettings) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=settings.vocab,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator((_read(p) for p in files), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|endoftext|>", bos_token="<|endoftext|>"
    )


def token_stream(tokenizer: Any, files: list[Path]) -> Any:
    import torch

    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for path in files:
        ids += tokenizer(_read(path))["input_ids"] + [eos]
    return torch.tensor(ids, dtype=torch.long)


def batches(tokens: Any, settings: ToySettings, generator: Any) -> Iterator[Any]:
    import torch

    span = settings.seq_len + 1
    while True:
        starts = torch.randint(0, len(tokens) - span, (settings.batch,), generator=generator)
        yield torch.stack([tokens[s : s + span] for s in starts.tolist()])


def train_target(tokens: Any, settings: ToySettings, log: Any) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=settings.vocab,
        hidden_size=settings.hidden,
        intermediate_size=settings.intermediate,
        num_hidden_layers=settings.layers,
        num_attention_heads=settings.heads,
        num_key_value_heads=settings.kv_heads,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(settings.seed)
    model = LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    generator = torch.Generator().manual_seed(settings.seed)
    loss = _train_loop(
        model,
        optimizer,
        batches(tokens, settings, generator),
        settings.target_steps,
        lambda batch: model(input_ids=batch[:, :-1], labels=batch[:, :-1]).loss,
        log,
        "target",
    )
    model.eval()
    return model, loss


def _train_loop(
    model: Any,
    optimizer: Any,
    data: Iterator[Any],
    steps: int,
    step_loss: Any,
    log: Any,
    label: str,
) -> float:
    """Train ``steps`` steps: a short warm-up, then cosine decay to a tenth of the rate."""
    import math

    import torch

    base_lrs = [g["lr"] for g in optimizer.param_groups]
    start, smoothed = time.monotonic(), float("nan")
    model.train()
    for step in range(steps):
        factor = min(1.0, (step + 1) / 20) * (
            0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps))
        )
        for group, lr in zip(optimizer.param_groups, base_lrs, strict=True):
            group["lr"] = lr * factor
        loss = step_loss(next(data))
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        smoothed = loss.item() if step == 0 else 0.95 * smoothed + 0.05 * loss.item()
        if (step + 1) % 50 == 0:
            elapsed = time.monotonic() - start
            log(f"{label}: step {step + 1}/{steps}, {elapsed:.0f}s, loss {smoothed:.3f}")
    log(f"{label}: {steps} steps in {time.monotonic() - start:.0f}s, final loss {smoothed:.3f}")
    return smoothed


def draft_vocabulary(tokens: Any, settings: ToySettings) -> Any:
    """The most frequent target token ids, sorted: the draft's vocabulary."""
    import torch

    counts = torch.bincount(tokens, minlength=settings.vocab)
    return counts.topk(settings.draft_vocab).indices.sort().values


def build_draft(target: Any, draft_ids: Any, settings: ToySettings) -> Any:
    import torch
    from transformers import LlamaConfig

    from eaglequant.model.eagle3 import Eagle3Draft

    config = draft_config(
        hidden=settings.hidden,
        heads=settings.heads,
        kv_heads=settings.kv_heads,
        intermediate=settings.intermediate,
        vocab=settings.vocab,
        draft_vocab=settings.draft_vocab,
        aux_layer_ids=AUX_LAYER_IDS,
        target_hidden_size=settings.hidden,
        max_position_embeddings=2048,
        norm_before_residual=settings.norm_before_residual,
    )
    torch.manual_seed(settings.seed + 1)
    draft = Eagle3Draft(LlamaConfig(**config))
    assert draft.embed_tokens is not None
    with torch.no_grad():
        draft.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
        draft.lm_head.weight.copy_(target.lm_head.weight[draft_ids])
        draft.d2t.copy_(draft_ids - torch.arange(settings.draft_vocab))
        draft.t2d.zero_()
        draft.t2d[draft_ids] = True
    draft.embed_tokens.weight.requires_grad_(False)
    return draft, config


def target_features(target: Any, batch: Any) -> tuple[Any, Any]:
    """Auxiliary hidden states (layers AUX_LAYER_IDS, concatenated) and next-token logits."""
    import torch

    with torch.no_grad():
        out = target(input_ids=batch, output_hidden_states=True)
    aux = torch.cat([out.hidden_states[i] for i in AUX_LAYER_IDS], dim=-1)
    return aux, out.logits


def draft_loss(draft: Any, target: Any, batch: Any, draft_ids: Any, steps: int) -> Any:
    """Soft cross-entropy of every unrolled step against the target's distribution."""
    import torch.nn.functional as F

    aux, logits = target_features(target, batch)
    t = batch.shape[1] - steps - 1
    # Later steps are fed the tokens a correct draft would have produced, so every
    # step's input token agrees with the context its teacher distribution saw.
    outputs = draft.unroll(aux[:, :t], batch[:, 1 : t + 1], steps, forced_ids=batch[:, 1:])
    loss: Any = 0.0
    for k, out in enumerate(outputs):
        # Step k at base i predicts token i+k+2, which the target predicts at position i+k+1.
        teacher = logits[:, k + 1 : k + 1 + t][..., draft_ids].float().softmax(-1)
        loss = loss + F.cross_entropy(out.logits.flatten(0, 1).float(), teacher.flatten(0, 1))
    return loss


def train_draft(target: Any, tokens: Any, settings: ToySettings, log: Any) -> Any:
    import torch

    draft_ids = draft_vocabulary(tokens, settings)
    draft, config = build_draft(target, draft_ids, settings)
    params = [p for p in draft.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=2e-3, weight_decay=0.0)
    generator = torch.Generator().manual_seed(settings.seed + 2)
    loss = _train_loop(
        draft,
        optimizer,
        batches(tokens, settings, generator),
        settings.draft_train_steps,
        lambda batch: draft_loss(draft, target, batch, draft_ids, settings.draft_steps),
        log,
        "draft",
    )
    draft.eval()
    return draft, config, loss


def held_out_prompts(tokenizer: Any, settings: ToySettings) -> list[dict[str, str]]:
    """Function and class openings from held-out files: prompts never seen in training."""
    prompts: list[dict[str, str]] = []
    for path in corpus_files(held_out=True):
        lines = _read(path).splitlines()
        for i, line in enumerate(lines):
            if line.startswith(("def ", "class ")) and len(prompts) < settings.prompts:
                text = "\n".join(lines[i : i + 3]) + "\n"
                if 8 <= len(tokenizer(text)["input_ids"]) <= 64:
                    prompts.append({"text": text})
                break
    return prompts


def calibration_records(
    settings: ToySettings, files: int = 48, chars: int = 6000
) -> list[dict[str, str]]:
    """Calibration text for the demo export: openings of training files (realistic inputs)."""
    train = corpus_files(held_out=False)
    step = max(1, len(train) // files)
    return [{"text": _read(p)[:chars]} for p in train[::step][:files]]


def make_pair(out: Path, settings: ToySettings, log: Any = print) -> PairSummary:
    """Build the whole pair into ``out`` (``target/``, ``draft/``, ``prompts.jsonl``)."""
    import torch

    torch.set_num_threads(settings.threads)
    torch.manual_seed(settings.seed)
    started = time.monotonic()
    train_files = corpus_files(held_out=False)
    tokenizer = train_tokenizer(train_files, settings)
    tokens = token_stream(tokenizer, train_files)
    log(f"corpus: {len(train_files)} files, {len(tokens)} tokens")
    target, target_loss = train_target(tokens, settings, log)
    draft, config, draft_loss_value = train_draft(target, tokens, settings, log)
    _save_pair(out, target, tokenizer, draft, config, settings)
    summary: PairSummary = {
        "train_files": len(train_files),
        "train_tokens": len(tokens),
        "target_loss": round(target_loss, 4),
        "draft_loss": round(draft_loss_value, 4),
        "seconds": round(time.monotonic() - started, 1),
        "settings": settings.__dict__,
    }
    (out / "make_pair.json").write_text(json.dumps(summary, indent=2) + "\n")
    log(json.dumps(summary))
    return summary


def make_draft(
    out: Path, target_dir: Path, settings: ToySettings, *, verifier: str | None, log: Any = print
) -> DraftSummary:
    """Train only a draft, for the toy target already in ``target_dir``, into ``out``.

    The same recipe as :func:`make_pair`'s draft (corpus, tokenizer of the target,
    steps, unrolling); with ``verifier`` (how the draft's config names its target)
    the draft is written in the speculators format.
    """
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    torch.set_num_threads(settings.threads)
    torch.manual_seed(settings.seed)
    started = time.monotonic()
    target = LlamaForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    tokens = token_stream(tokenizer, corpus_files(held_out=False))
    draft, config, loss = train_draft(target, tokens, settings, log)
    save_draft(out, draft, config, verifier)
    summary: DraftSummary = {
        "target": str(target_dir),
        "draft_loss": round(loss, 4),
        "seconds": round(time.monotonic() - started, 1),
        "settings": settings.__dict__,
    }
    (out / "make_draft.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def deepen_target(src: Path, dst: Path, extra_layers: int, seed: int = 0) -> Path:
    """Copy the Llama target in ``src`` to ``dst`` with ``extra_layers`` more layers that add zero.

    Each new layer (after the last one, so every auxiliary layer id keeps its
    hidden states) has random q/k/v/gate/up weights and zero ``o_proj`` and
    ``down_proj``: it costs a real layer's compute and KV cache but adds exactly
    zero to the residual, so the deeper target computes the same next tokens and
    the draft trained for ``src`` keeps its acceptance. It is the toy's stand-in
    for a target whose forward pass costs far more than a draft step, the case
    speculative decoding exists for.
    """
    import torch
    from safetensors.torch import load_file, save_file

    config = json.loads((src / "config.json").read_text())
    last = config["num_hidden_layers"] - 1
    tensors = load_file(str(src / "model.safetensors"))
    generator = torch.Generator().manual_seed(seed)
    prefix = f"model.layers.{last}."
    template = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
    for layer in range(last + 1, last + 1 + extra_layers):
        for name, like in template.items():
            tensors[f"model.layers.{layer}.{name}"] = _added_layer_tensor(name, like, generator)
    config["num_hidden_layers"] = last + 1 + extra_layers
    dst.mkdir(parents=True, exist_ok=True)
    for item in src.iterdir():
        if item.is_file() and item.name not in ("config.json", "model.safetensors"):
            (dst / item.name).write_bytes(item.read_bytes())
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return dst


def _added_layer_tensor(name: str, like: Any, generator: Any) -> Any:
    """A deepened layer's tensor: the residual writers are zero, norms copied, the rest random."""
    import torch

    if name.endswith(("o_proj.weight", "down_proj.weight")):
        return torch.zeros_like(like)
    if "norm" in name:
        return like.clone()
    return (torch.randn(like.shape, generator=generator) * 0.02).to(like.dtype)


def save_draft(
    folder: Path, draft: Any, config: dict[str, Any], verifier: str | None = None
) -> None:
    """The trained draft in BF16: EAGLE-3 layout, or the speculators format with ``verifier``."""
    import torch

    tensors = (
        (name, t.to(torch.bfloat16) if t.is_floating_point() else t)
        for name, t in sorted(draft.state_dict().items())
    )
    write_draft(folder, config, tensors, 5 * 10**9, speculators_verifier=verifier)


def _save_pair(
    out: Path,
    target: Any,
    tokenizer: Any,
    draft: Any,
    config: dict[str, Any],
    settings: ToySettings,
) -> None:
    import torch

    from eaglequant.io.writer import write_text

    target.to(torch.bfloat16).save_pretrained(out / "target")
    tokenizer.save_pretrained(out / "target")
    save_draft(out / "draft", draft, config)
    prompts = held_out_prompts(tokenizer, settings)
    write_text(out / "prompts.jsonl", "".join(json.dumps(p) + "\n" for p in prompts))
    calibration = calibration_records(settings)
    write_text(out / "calibration.jsonl", "".join(json.dumps(r) + "\n" for r in calibration))
