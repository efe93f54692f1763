"""The accelerator recipe's stages on the toy target, on the CPU: batched work equals one at a time.

The lent accelerator runs these same functions on CUDA (the committed SmolLM2 draft was
made so); here the batched greedy answers (left-padded) are held to each prompt answered
alone, the batched states (right-padded) to each sequence's own forward, and training to a
lower loss on its own batch. The target runs in float64 so that batching changes no argmax.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from eaglequant.rules.target_fit import default_aux_layers
from eaglequant_examples import accelerated
from eaglequant_examples import train_draft as td
from eaglequant_examples.answers import cut_answer, generate_answers, pack_ids, unpack_ids
from tests.conftest import TOY

ROWS = [[5, 6, 7], [], [8], [9, 10, 11, 12, 13]]


@pytest.fixture(scope="module")
def target() -> torch.nn.Module:
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(TOY / "target", dtype=torch.float64).eval()
    model.requires_grad_(False)
    return model


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(TOY / "target")
    texts = ["def add(a, b):", "import os\n", "class Point:\n    def __init__(self", "x = ["]
    return [tokenizer(t)["input_ids"] for t in texts]


def test_ids_round_trip_through_safetensors(tmp_path: Path) -> None:
    save_file(pack_ids(ROWS), str(tmp_path / "ids.safetensors"))
    assert unpack_ids(load_file(str(tmp_path / "ids.safetensors"))) == ROWS


def test_an_answer_keeps_its_first_stop_token_and_nothing_after() -> None:
    assert cut_answer([4, 2, 9, 2], {2}) == [4, 2]
    assert cut_answer([4, 9], {2}) == [4, 9]


def test_the_weights_digest_sees_one_changed_value(target: torch.nn.Module) -> None:
    state = {k: v.clone() for k, v in target.state_dict().items()}
    before = accelerated.weights_digest(state)
    assert accelerated.weights_digest(state) == before
    next(iter(state.values())).view(-1)[0] += 1
    assert accelerated.weights_digest(state) != before


def test_batched_answers_equal_each_prompt_answered_alone(
    target: torch.nn.Module, prompts: list[list[int]]
) -> None:
    def answers(rows: list[list[int]]) -> list[list[int]]:
        return generate_answers(target, rows, max_new_tokens=12, stop_ids={0}, pad_id=0)

    batched = answers(prompts)
    assert batched == [answers([p])[0] for p in prompts]
    assert all(len(a) >= 2 for a in batched)  # a check that answered nothing proves nothing


def test_batched_states_equal_each_sequence_alone(
    target: torch.nn.Module, prompts: list[list[int]]
) -> None:
    sequences = [td.Sequence(torch.tensor([*p, 7, 8, 9]), len(p)) for p in prompts]
    layers = (1, 2, 3)
    batched = accelerated.device_features(target, sequences, layers, batch_tokens=48)
    for sequence, states in zip(sequences, batched, strict=True):
        alone = td._aux_states(target, sequence.ids, layers)
        assert states.shape == alone.shape == (len(sequence.ids), 3 * target.config.hidden_size)
        torch.testing.assert_close(states.float(), alone.float(), rtol=0, atol=0)


def test_training_from_answers_lowers_the_loss_on_its_own_batch(
    prompts: list[list[int]], tmp_path: Path
) -> None:
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(TOY / "target", dtype=torch.bfloat16).eval()
    model.requires_grad_(False)
    answers = generate_answers(model, prompts, max_new_tokens=24, stop_ids={0}, pad_id=0)
    recipe = td.TrainRecipe(draft_vocab=256, epochs=0, batch_tokens=4096, lr=3e-3, warmup_steps=1)
    untrained, *_ = accelerated.train_from_answers(
        model, prompts, answers, recipe, tmp_path / "a", lambda _m: None
    )
    with torch.no_grad():  # as a process that imported vLLM or Quark may have left it
        trained, config, as_trained, summary = accelerated.train_from_answers(
            model, prompts, answers, replace(recipe, epochs=12), tmp_path / "b", lambda _m: None
        )
    aux = tuple(summary["aux_layers"])
    assert as_trained.epochs == 12 and summary["result"]["steps"] == 12
    assert config["draft_vocab_size"] == 256 and aux == default_aux_layers(4)
    sequences = [
        td.Sequence(torch.tensor(p + a), len(p)) for p, a in zip(prompts, answers, strict=True)
    ]
    features = accelerated.device_features(model, sequences, aux, 4096)
    batch = td._collate(list(range(len(sequences))), sequences, features, recipe.ttt_steps)

    def loss(draft: td.Eagle3Draft) -> float:
        to_draft = torch.full((draft.dims.vocab,), -1, dtype=torch.long)
        rows = torch.arange(draft.dims.draft_vocab)
        to_draft[rows + draft.d2t] = rows
        with torch.no_grad():
            value, _ = td.ttt_loss(draft, model.model.embed_tokens, *batch, to_draft, recipe)
        return float(value)

    assert loss(trained) < 0.8 * loss(untrained)


def test_answering_keeps_what_was_answered_and_stops_at_the_deadline(
    target: torch.nn.Module, prompts: list[list[int]], tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    from eaglequant_examples.answers import answer
    from eaglequant_examples.selfdistill import DataRecipe

    tokenizer = AutoTokenizer.from_pretrained(TOY / "target")
    data = DataRecipe(max_answer_tokens=6, chunk=1, generator="transformers")
    path = tmp_path / "answers.safetensors"
    save_file(pack_ids([[41, 42]]), str(path))  # the first prompt's, from an earlier run
    expired = answer(target, tokenizer, prompts, data, path, float("-inf"), lambda _m: None)
    assert expired == [[41, 42]]  # nothing started after the deadline
    done = answer(target, tokenizer, prompts, data, path, float("inf"), lambda _m: None)
    assert done[0] == [41, 42] and len(done) == len(prompts)
    assert all(1 <= len(a) <= 6 for a in done[1:])
    assert unpack_ids(load_file(str(path))) == done  # rewritten as it went: a rerun resumes


def test_held_out_sequences_choose_the_epoch_the_draft_ends_with(tmp_path: Path) -> None:
    from transformers import AutoTokenizer, LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(TOY / "target", dtype=torch.bfloat16).eval()
    model.requires_grad_(False)
    tokenizer = AutoTokenizer.from_pretrained(TOY / "target")
    heads = ["def ", "import ", "class ", "for ", "if ", "return ", "with ", "    self."]
    prompts = [tokenizer(h)["input_ids"] for h in heads]
    answers = generate_answers(model, prompts, max_new_tokens=48, stop_ids={0}, pad_id=0)
    recipe = td.TrainRecipe(
        draft_vocab=256, epochs=6, batch_tokens=4096, lr=3e-3, warmup_steps=1, held_out=2
    )
    logged: list[str] = []
    trained, _config, _recipe, summary = accelerated.train_from_answers(
        model, prompts, answers, recipe, tmp_path, logged.append
    )
    held = summary["result"]["held_out"]
    by_epoch = held["top1_by_step_by_epoch"]
    assert held["sequences"] == 2 and summary["result"]["steps"] == 6 and len(by_epoch) == 6
    proxies = [td.acceptance_proxy(t) for t in by_epoch]
    assert held["chosen_epoch"] == 1 + proxies.index(max(proxies))
    assert any(max(t) > 0 for t in by_epoch)  # a held-out set that saw no hit chose nothing
    # the draft is the chosen epoch's: its held-out top-1, measured again, is that epoch's
    assert all(len(a) >= 2 for a in answers)  # so train_from_answers kept every sequence
    fit, kept_out = td.split_held_out(len(prompts), recipe)
    assert len(kept_out) == 2 and sorted(fit + kept_out) == list(range(len(prompts)))
    held_out = [
        td.Sequence(torch.tensor(prompts[i] + answers[i]), len(prompts[i])) for i in kept_out
    ]
    aux = tuple(summary["aux_layers"])
    features = accelerated.device_features(model, held_out, aux, 4096)
    to_draft = torch.full((trained.dims.vocab,), -1, dtype=torch.long)
    rows = torch.arange(trained.dims.draft_vocab)
    to_draft[rows + trained.d2t] = rows
    top1 = td.held_out_top1(trained, model.model.embed_tokens, held_out, features, to_draft, recipe)
    assert [round(a, 4) for a in top1] == by_epoch[held["chosen_epoch"] - 1]
    assert any("held-out top-1" in line for line in logged)
    # a rerun in the same folder resumes from the last checkpoint, which keeps the choice
    every = [
        td.Sequence(torch.tensor(p + a), len(p)) for p, a in zip(prompts, answers, strict=True)
    ]
    resumed = copy.deepcopy(trained)
    with torch.no_grad():
        for parameter in resumed.parameters():
            parameter.add_(1.0)
    again = td.train(
        resumed,
        model.model.embed_tokens,
        every,
        accelerated.device_features(model, every, aux, 4096),
        recipe,
        tmp_path / "train",
        lambda _m: None,
    )
    assert again["held_out"] == held
    for name, value in trained.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[name], value, rtol=0, atol=0)
