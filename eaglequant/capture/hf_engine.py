"""Capture with transformers, in this process: for targets small enough to run on one box.

The target runs in float32; ``output_hidden_states`` gives ``hidden_states[i]``,
the residual stream entering decoder layer ``i`` (``hidden_states[0]`` is the
embedding output). That is exactly what vLLM captures for auxiliary layer id
``i`` (``_maybe_add_hidden_state(…, idx + 1, …)`` after layer ``idx``), so the
same ids mean the same states in both engines; only ``hidden_states[L]`` differs
(transformers applies the final norm), which is why ids stop at ``L - 1``.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
import transformers
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM

from eaglequant.capture.records import TransformersRun
from eaglequant.capture.store import CaptureFile
from eaglequant.engine.introspection import tree_peak_rss_mib

BATCH = 4


def capture_transformers(
    target: Path,
    file: CaptureFile,
    aux_ids: tuple[int, ...],
    trust_remote_code: bool,
) -> TransformersRun:
    """Fill every row of ``file``; returns the engine's record for ``capture.json``."""
    started = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(
        target, dtype=torch.float32, trust_remote_code=trust_remote_code, use_safetensors=True
    ).eval()
    loaded = time.perf_counter()
    sequences = file.sequences()
    with torch.no_grad():
        for first, rows in tqdm(
            list(_batches(sequences)), desc="target hidden states", unit="batch", disable=None
        ):
            states = model(input_ids=torch.tensor(rows), output_hidden_states=True).hidden_states
            aux = torch.cat([states[i] for i in aux_ids], dim=-1)
            for offset, row in enumerate(aux):
                file.write_row(first + offset, row)
    done = time.perf_counter()
    return {
        "name": "transformers",
        "transformers": transformers.__version__,
        "dtype": "float32",
        "load_s": round(loaded - started, 2),
        "run_s": round(done - loaded, 2),
        "peak_rss_mib": tree_peak_rss_mib(),
    }


def _batches(sequences: list[list[int]]) -> list[tuple[int, list[list[int]]]]:
    """(first row, rows): up to BATCH consecutive sequences of one length."""
    found: list[tuple[int, list[list[int]]]] = []
    for row, seq in enumerate(sequences):
        if found and len(found[-1][1]) < BATCH and len(found[-1][1][0]) == len(seq):
            found[-1][1].append(seq)
        else:
            found.append((row, [seq]))
    return found
