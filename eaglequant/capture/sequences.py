"""Calibration text to token-id sequences, tokenized as the target's tokenizer does.

Text comes from ``.jsonl`` (``text``, or chat ``messages`` rendered with the
tokenizer's chat template) or ``.txt``; it is tokenized, joined with EOS and
cut into rows of ``seq_len`` tokens, so every engine sees the same ids.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eaglequant.errors import InputError
from eaglequant.io.records import jsonl_records, read_utf8


def tokenize_data(
    target: Path, data: Path, seq_len: int, count: int, trust_remote_code: bool
) -> list[list[int]]:
    """``count`` (at most) sequences of ``seq_len`` token ids from ``data``."""
    from transformers import AutoTokenizer

    if not data.is_file():
        raise InputError(f"{data}: no such calibration data file")
    tokenizer = AutoTokenizer.from_pretrained(target, trust_remote_code=trust_remote_code)
    return pack_sequences(read_texts(data, tokenizer), tokenizer, seq_len, count)


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


def pack_sequences(texts: list[str], tokenizer: Any, seq_len: int, count: int) -> list[list[int]]:
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
            f"{seq_len}; give more text or shorter sequences"
        )
    return [ids[i * seq_len : (i + 1) * seq_len] for i in range(rows)]
