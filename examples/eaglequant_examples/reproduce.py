"""The committed SmolLM2 draft from its recipe: one call, every stage resumable.

Stages: the training prompts and their disjointness from MT-Bench and
HumanEval; the target's greedy answers (vLLM); the draft vocabulary, its size
chosen as the smallest candidate whose held-out coverage reaches
``COVERAGE_GOAL``; the target's auxiliary states (transformers); training;
the BF16 draft and ``recipe.json`` beside it (what went in, sha256s, sizes,
timings, the code's commit).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from eaglequant.io.packaged import file_sha256
from eaglequant.io.writer import write_text
from eaglequant_examples.records import ReproducedRecipe
from eaglequant_examples.selfdistill import (
    DataRecipe,
    disjointness,
    generate,
    held_out_sets,
    training_prompts,
)
from eaglequant_examples.toy import save_draft

RECIPE_FILE = "recipe.json"
VOCAB_SIZES = (4096, 8192, 12288, 16384)  # 16384 rows of lm_head keep the draft under 40 MB
COVERAGE_GOAL = 0.995

Log = Callable[[str], None]


def read_recipe(path: Path) -> tuple[DataRecipe, Any]:
    from eaglequant_examples.train_draft import TrainRecipe

    recipe = json.loads(path.read_text())
    return DataRecipe(**recipe["data"]), TrainRecipe(**recipe["train"])


def reproduce(
    *, target: Path, work: Path, out: Path, data: DataRecipe, train: Any, log: Log
) -> ReproducedRecipe:
    """Run every stage into ``work`` (kept, for resuming) and write the draft to ``out``."""
    import torch
    from transformers import LlamaForCausalLM

    from eaglequant.rules.target_fit import default_aux_layers
    from eaglequant_examples import train_draft as td

    torch.manual_seed(train.seed)
    torch.set_num_threads(train.threads)
    timings: dict[str, float] = {}
    started = time.monotonic()
    texts = training_prompts(data)
    overlap = disjointness(texts, held_out_sets())
    chunks = generate(target, data, work / "answers", log)
    timings["generate_s"] = round(time.monotonic() - started, 1)

    sequences = td.read_sequences(chunks, train)
    held_out = td.read_sequences(chunks[-1:], train)
    fitted = td.read_sequences(chunks[:-1], train)
    coverage = td.vocabulary_coverage(fitted, held_out, list(VOCAB_SIZES))
    size = next((n for n in VOCAB_SIZES if coverage[n] >= COVERAGE_GOAL), VOCAB_SIZES[-1])
    train = replace(train, draft_vocab=size)
    log(f"draft vocabulary: held-out coverage {coverage}; chose {size}")

    model = LlamaForCausalLM.from_pretrained(target, dtype=torch.bfloat16).eval()
    model.requires_grad_(False)
    aux = default_aux_layers(model.config.num_hidden_layers)
    mark = time.monotonic()
    features = td.target_features(model, sequences, aux, work, log)
    timings["features_s"] = round(time.monotonic() - mark, 1)

    draft, config = td.build_draft(model, td.draft_vocabulary(sequences, size), aux, train)
    mark = time.monotonic()
    summary = td.train(draft, model.model.embed_tokens, sequences, features, train, work, log)
    timings["train_s"] = round(time.monotonic() - mark, 1)
    save_draft(out, draft, config)  # BF16; no embed_tokens: vLLM lends the target's
    record: ReproducedRecipe = {
        "data": asdict(data),
        "train": asdict(train),
        "target": target_record(target),
        "held_out_sets": overlap,
        "answers": {
            "chunks": [{"file": p.name, "sha256": file_sha256(p)} for p in chunks],
            "sequences": len(sequences),
            "tokens": sum(len(s.ids) for s in sequences),
            "answer_tokens": sum(len(s.ids) - s.answer_start for s in sequences),
        },
        "draft_vocabulary": {"held_out_coverage": coverage, "goal": COVERAGE_GOAL, "size": size},
        "aux_layers": list(aux),
        "result": summary,
        "timings": timings | {"total_s": round(time.monotonic() - started, 1)},
        "code_commit": code_commit(),
    }
    write_text(out / RECIPE_FILE, json.dumps(record, indent=2) + "\n")
    return record


def target_record(target: Path) -> dict[str, str]:
    """The converted target's ``eaglequant-source.json`` (else its folder's name)."""
    source = target / "eaglequant-source.json"
    return json.loads(source.read_text()) if source.is_file() else {"path": target.name}


def code_commit() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "HEAD"],
        cwd=Path(__file__).parent,
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() or "unknown"
