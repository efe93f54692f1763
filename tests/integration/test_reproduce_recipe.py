"""``eaglequant example train-draft --recipe``: a ``generator: transformers`` recipe, whole.

The committed SmolLM2 draft's recipe runs through this very command on a GPU. Here a
recipe of the same kind, shrunk to eight prompts from a local file, 8-token answers and
one epoch, runs it end to end on the CPU: prompts and their disjointness from MT-Bench
and HumanEval, answers, states, training, the draft and its ``recipe.json``; a second run
over the same work folder resumes every stage and writes the same draft.
"""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import load_file

from eaglequant.io.packaged import file_sha256
from tests.support import invoke

PROMPTS = [
    "Write a haiku about the sea.",
    "What is the capital of France?",
    "Explain recursion to a child.",
    "List three prime numbers.",
    "How do I boil an egg?",
    "Name a famous painter.",
    "Why is the sky blue?",
    "Give me a synonym for happy.",
]


def test_a_transformers_recipe_runs_whole_on_the_cpu_and_resumes(tmp_path: Path) -> None:
    code, output = invoke(["prompts", "fetch", "mt-bench", "humaneval"])
    assert code == 0, output
    code, output = invoke(["example", "smollm2", str(tmp_path / "pair")])
    assert code == 0, output
    source = tmp_path / "prompts.jsonl"
    source.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    data = {"source": str(source), "start": 0, "prompts": 8, "max_answer_tokens": 8}
    data |= {"chunk": 4, "generator": "transformers", "answered": 6}
    train = {"draft_vocab": 256, "epochs": 1, "batch_tokens": 512, "warmup_steps": 1}
    train |= {"held_out": 2, "threads": 2}
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps({"data": data, "train": train}))
    work, target = tmp_path / "work", tmp_path / "pair" / "target"
    args = ["example", "train-draft", str(target), "--recipe", str(recipe), "--work", str(work)]

    code, output = invoke([*args, str(tmp_path / "draft"), "--device", "cpu"])
    assert code == 0, output
    draft = tmp_path / "draft"
    config = json.loads((draft / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["draft_vocab_size"] == 256
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]
    record = json.loads((draft / "recipe.json").read_text())
    assert record["prompts"]["taken"] == 8 and record["prompts"]["answered"] == 6
    assert record["prompts"]["ids_sha256"] == file_sha256(work / "prompts.safetensors")
    assert record["answers"]["sha256"] == file_sha256(work / "answers.safetensors")
    assert record["answers"]["sequences"] == 6
    for name in ("mt-bench", "humaneval"):
        assert record["held_out_sets"][name]["exact"] == 0
    answers = file_sha256(work / "answers.safetensors")

    code, output = invoke([*args, str(tmp_path / "again"), "--device", "cpu"])
    assert code == 0, output
    assert file_sha256(work / "answers.safetensors") == answers  # answered once, then kept
    first, second = (
        load_file(draft / "model.safetensors"),
        load_file(tmp_path / "again" / "model.safetensors"),
    )
    assert first.keys() == second.keys()
    assert all(first[k].equal(second[k]) for k in first)
