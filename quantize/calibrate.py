"""Calibration inputs that match what the draft sees inside vLLM.

A calibration sequence is the target's token ids and its auxiliary hidden
states (the layers in ``eagle_aux_hidden_state_layer_ids``, else vLLM's
default ``(2, L//2, L-3)``), concatenated as ``fc`` expects. Sources:

* a target model and a text file (``.jsonl`` with ``text`` or chat
  ``messages``, or ``.txt``), run here with transformers;
* a capture folder written by ``eaglequant capture`` (``hidden_states.safetensors``:
  ``input_ids`` int64 [N, T], ``aux_hidden_states`` [N, T, num_aux*target_hidden],
  optional ``embed_tokens.weight``; ``capture.json`` with the layer ids, the
  target's sizes and the token count).

The first ``samples`` sequences calibrate; the next ``held_out`` measure.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from eaglequant.draft import DraftDims
from eaglequant.errors import InputError
from eaglequant.io.records import jsonl_records, read_utf8

CAPTURE_TENSORS = "hidden_states.safetensors"
CAPTURE_INFO = "capture.json"
CAPTURE_FORMAT = "eaglequant-capture-v1"


@dataclass
class CalibrationData:
    """Token ids [N, T] and auxiliary hidden states [N, T, fc_in] (as captured or computed)."""

    input_ids: torch.Tensor
    aux_hidden: torch.Tensor
    source: str
    embed_tokens: torch.Tensor | None = None

    @property
    def tokens(self) -> int:
        return int(self.input_ids.numel())

    def split(self, samples: int, held_out: int) -> tuple[CalibrationData, CalibrationData]:
        """Calibration and held-out parts (held-out shrinks when there is too little data)."""
        total = len(self.input_ids)
        held = min(held_out, max(total - 1, 0) // 2)
        calib = min(samples, total - held)
        parts = [slice(0, calib), slice(total - held, total)]
        calib_part, held_part = (
            CalibrationData(self.input_ids[s], self.aux_hidden[s], self.source, self.embed_tokens)
            for s in parts
        )
        return calib_part, held_part

    def batches(self, batch_size: int) -> list[dict[str, torch.Tensor]]:
        """Draft inputs: aux states at positions 0..T-2 with the tokens at 1..T-1."""
        return [
            {
                "aux_hidden": self.aux_hidden[i : i + batch_size, :-1],
                "next_ids": self.input_ids[i : i + batch_size, 1:],
            }
            for i in range(0, len(self.input_ids), batch_size)
        ]


def read_texts(path: Path, tokenizer: Any) -> list[str]:
    """Texts from ``.jsonl`` (``text`` or chat ``messages``) or ``.txt``; InputError if none."""
    raw = read_utf8(path, "calibration data")
    if path.suffix == ".jsonl":
        texts = [_record_text(path, n, record, tokenizer) for n, record in jsonl_records(path, raw)]
    else:
        texts = [raw]
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise InputError(
            f"{path}: no usable text; give .jsonl records with 'text' or 'messages', or a .txt file"
        )
    return texts


def _record_text(path: Path, number: int, record: dict[str, Any], tokenizer: Any) -> str:
    if isinstance(record.get("text"), str):
        return str(record["text"])
    if isinstance(record.get("messages"), list):
        if getattr(tokenizer, "chat_template", None) is None:
            raise InputError(
                f"{path}:{number}: chat 'messages' need a tokenizer chat template, and the "
                "target's tokenizer has none; use 'text' records"
            )
        return str(tokenizer.apply_chat_template(record["messages"], tokenize=False))
    raise InputError(f"{path}:{number}: needs a 'text' string or a 'messages' list")


def pack_sequences(texts: list[str], tokenizer: Any, seq_len: int, count: int) -> torch.Tensor:
    """Tokenize, join with EOS, and cut into ``count`` (at most) rows of ``seq_len`` tokens."""
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for text in texts:
        ids += tokenizer(text)["input_ids"] + ([eos] if eos is not None else [])
        if len(ids) >= seq_len * count:
            break
    rows = min(count, len(ids) // seq_len)
    if rows == 0:
        raise InputError(
            f"calibration data: only {len(ids)} tokens, fewer than one sequence of "
            f"{seq_len}; give more text or lower --calib-seq-len"
        )
    return torch.tensor(ids[: rows * seq_len]).view(rows, seq_len)


def run_target(
    target_dir: Path,
    data_path: Path,
    aux_ids: tuple[int, ...],
    seq_len: int,
    count: int,
    trust_remote_code: bool = False,
    with_embeddings: bool = False,
) -> CalibrationData:
    """Run the target with transformers and capture its auxiliary hidden states."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target_dir, trust_remote_code=trust_remote_code)
    input_ids = pack_sequences(read_texts(data_path, tokenizer), tokenizer, seq_len, count)
    model = AutoModelForCausalLM.from_pretrained(
        target_dir, dtype=torch.float32, trust_remote_code=trust_remote_code, use_safetensors=True
    ).eval()
    aux_rows = []
    with torch.no_grad():
        rows = input_ids.split(4)
        for row in tqdm(rows, desc="target hidden states", unit="batch", disable=None):
            states = model(input_ids=row, output_hidden_states=True).hidden_states
            aux_rows.append(torch.cat([states[i] for i in aux_ids], dim=-1))
    embed = model.get_input_embeddings().weight.detach().clone() if with_embeddings else None
    return CalibrationData(input_ids, torch.cat(aux_rows), f"target {target_dir}", embed)


def save_capture(folder: Path, data: CalibrationData, info: dict[str, Any]) -> None:
    """Write a capture folder (inside an atomic output folder)."""
    from eaglequant.io.layout import blob_from_tensor
    from eaglequant.io.writer import write_safetensors, write_text

    tensors = {"input_ids": data.input_ids, "aux_hidden_states": data.aux_hidden.bfloat16()}
    if data.embed_tokens is not None:
        tensors["embed_tokens.weight"] = data.embed_tokens.bfloat16()
    write_safetensors(
        folder / CAPTURE_TENSORS, [blob_from_tensor(k, v) for k, v in tensors.items()]
    )
    info = {"format": CAPTURE_FORMAT, "tokens": data.tokens, **info}
    write_text(folder / CAPTURE_INFO, json.dumps(info, indent=2) + "\n")


def load_capture(folder: Path, dims: DraftDims) -> CalibrationData:
    """Read a capture folder and check it fits the draft."""
    from eaglequant.io.safetensors_header import read_header

    path = folder / CAPTURE_TENSORS if folder.is_dir() else folder
    if not path.is_file():
        raise InputError(f"{path}: no such capture file; run `eaglequant capture` first")
    header = read_header(path)
    for name in ("input_ids", "aux_hidden_states"):
        if name not in header.tensors:
            raise InputError(f"{path}: tensor '{name}' is missing; re-run `eaglequant capture`")
    ids_info, aux_info = header.tensors["input_ids"], header.tensors["aux_hidden_states"]
    if len(aux_info.shape) != 3 or aux_info.shape[-1] != dims.fc_in:
        raise InputError(
            f"{path}: tensor 'aux_hidden_states' has shape {list(aux_info.shape)}, the draft's fc "
            f"takes width {dims.fc_in}; capture from the target this draft was trained for"
        )
    if ids_info.shape != aux_info.shape[:2]:
        raise InputError(f"{path}: 'input_ids' {list(ids_info.shape)} does not match the states")
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        ids = handle.get_tensor("input_ids").long()
        aux = handle.get_tensor("aux_hidden_states")
        embed = (
            handle.get_tensor("embed_tokens.weight")
            if "embed_tokens.weight" in handle.keys()  # noqa: SIM118 (safe_open has no __contains__)
            else None
        )
    if int(ids.max()) >= dims.vocab or int(ids.min()) < 0:
        raise InputError(f"{path}: token ids exceed the draft's vocab_size {dims.vocab}")
    return CalibrationData(ids, aux, f"capture {path}", embed)
