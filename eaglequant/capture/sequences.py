"""Calibration text to token-id sequences, tokenized as the target's tokenizer does.

Text comes from ``.jsonl`` (``text``, or chat ``messages`` rendered with the
tokenizer's chat template), ``.txt``, or a named prompt set (each prompt's
text); it is tokenized, joined with EOS and cut into rows of ``seq_len``
tokens, so every engine sees the same ids. What was used is recorded by text
hash, so a validation on the same prompts can say so.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eaglequant.capture.records import DataProvenance
from eaglequant.errors import InputError
from eaglequant.io.textfiles import jsonl_records, read_utf8
from eaglequant.prompts.source import PromptSource, load_prompts, text_hashes


@dataclass(frozen=True)
class TokenizedData:
    """The sequences, and where they came from: source, sha256 and the used texts' hashes."""

    sequences: list[list[int]]
    provenance: DataProvenance


def as_source(data: Path | PromptSource) -> PromptSource:
    return data if isinstance(data, PromptSource) else PromptSource(path=data)


def check_data(data: Path | PromptSource) -> None:
    """Before heavy work: the file exists, or the set is installed and unchanged."""
    source = as_source(data)
    if source.path is None:
        load_prompts(source)
    elif not source.path.is_file():
        raise InputError(f"{source.path}: no such calibration data file")


def tokenize_data(
    target: Path, data: Path | PromptSource, seq_len: int, count: int, trust_remote_code: bool
) -> TokenizedData:
    """``count`` (at most) sequences of ``seq_len`` token ids from ``data``."""
    # lazy: torch-free core
    from transformers import AutoTokenizer

    check_data(data)
    source = as_source(data)
    tokenizer = AutoTokenizer.from_pretrained(target, trust_remote_code=trust_remote_code)
    if source.path is None:
        prompts = load_prompts(source)
        texts, digest = [t for t in prompts.texts if t.strip()], prompts.sha256
    else:
        texts = read_texts(source.path, tokenizer)
        digest = hashlib.sha256(source.path.read_bytes()).hexdigest()
    sequences, used = pack_sequences(texts, tokenizer, seq_len, count)
    provenance: DataProvenance = {
        "source": str(source),
        "sha256": digest,
        "texts": used,
        "text_hashes": text_hashes(texts[:used]),
    }
    return TokenizedData(sequences, provenance)


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


def pack_sequences(
    texts: list[str], tokenizer: Any, seq_len: int, count: int
) -> tuple[list[list[int]], int]:
    """Tokenize, join with EOS, and cut into ``count`` (at most) rows of ``seq_len`` tokens;
    also how many of ``texts`` were tokenized."""
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    used = 0
    for text in texts:
        ids += tokenizer(text)["input_ids"] + ([eos] if eos is not None else [])
        used += 1
        if len(ids) >= seq_len * count:
            break
    rows = min(count, len(ids) // seq_len)
    if rows == 0:
        raise InputError(
            f"calibration data: only {len(ids)} tokens, fewer than one sequence of "
            f"{seq_len}; give more text or shorter sequences"
        )
    return [ids[i * seq_len : (i + 1) * seq_len] for i in range(rows)], used
