"""Second turns before any engine: the records that carry them, the conversations they make,
what engines are asked and how the answered ones join the measured prompts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from eaglequant.cli import main
from eaglequant.engine.child_request import EngineRequest
from eaglequant.engine.config import EngineOptions, VllmInstall
from eaglequant.errors import InputError
from eaglequant.prompts.chat import RenderedPrompts
from eaglequant.prompts.format import Prompt, prompt_record, read_prompt_file
from eaglequant.prompts.registry import SETS
from eaglequant.prompts.source import PromptSet
from eaglequant.prompts.turns import (
    AnsweredJson,
    SecondTurns,
    SecondTurnsJson,
    asked_turns,
    describe,
    second_turn_text,
)
from eaglequant.validate.request import ValidateRequest, engine_prompts
from eaglequant.validate.second_turns import check_second_turn_lengths, measured_request
from tests.conftest import TOY
from tests.support import write_chat_target


@pytest.fixture
def chat_target(tmp_path: Path) -> Path:
    """A character-level tokenizer with a chat template that writes BOS."""
    folder = write_chat_target(tmp_path / "chat-target", adds_bos=False)
    (folder / "config.json").write_text(json.dumps({"max_position_embeddings": 128}))
    return folder


def test_a_records_second_turn_is_its_followup() -> None:
    assert prompt_record("f:1", {"turns": ["q", "more"], "category": "c"}) == Prompt(
        "q", "c", "more"
    )
    assert prompt_record("f:1", {"turns": ["q"]}).followup is None
    assert prompt_record("f:1", {"turns": ["q", " "]}).followup is None  # a blank turn: none
    assert prompt_record("f:1", {"turns": ["q", "2nd", "3rd"]}).followup == "2nd"
    assert prompt_record("f:1", {"text": "q", "turns": ["x", "y"]}) == Prompt("q")


def test_mt_bench_keeps_both_turns() -> None:
    lines = [
        {"question_id": 81, "category": "writing", "turns": ["Compose a blog.", "Rewrite it."]},
        {"question_id": 82, "category": "roleplay", "turns": ["Pretend.", "Go on."]},
    ]
    data = "".join(json.dumps(r) + "\n" for r in lines).encode()
    prompts = SETS["mt-bench"].parse(data, "question.jsonl")
    assert [(p.text, p.category, p.followup) for p in prompts] == [
        ("Compose a blog.", "writing", "Rewrite it."),
        ("Pretend.", "roleplay", "Go on."),
    ]
    assert PromptSet("mt-bench", "0" * 64, prompts).followups == ["Rewrite it.", "Go on."]
    assert PromptSet("x", "0" * 64, [Prompt("a"), Prompt("b")]).followups is None


def test_the_conversation_goes_through_the_chat_template(chat_target: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(chat_target)
    first = "<s><|user|>hi<|end|><|assistant|>"
    text = second_turn_text(tokenizer, True, "hi", first, "hello", "and then?")
    assert (
        text == "<s><|user|>hi<|end|><|assistant|>hello<|end|><|user|>and then?<|end|><|assistant|>"
    )
    assert text.startswith(first)  # the answer continues the first turn as the target saw it
    raw = second_turn_text(tokenizer, False, "hi", "hi", " there", "and then?")
    assert raw == "hi there\n\nand then?"
    toy = AutoTokenizer.from_pretrained(TOY / "target")  # no template: raw
    assert second_turn_text(toy, True, "a", "a", "b", "c") == "ab\n\nc"


def _asked(turns: int = 2) -> SecondTurnsJson:
    return {
        "turns": asked_turns(["p0", "p1", "p2"], ["s0", None, "s2"])[:turns],
        "chat_template": False,
        "tokenizer": str(TOY / "target"),
        "trust_remote_code": False,
        "max_tokens": 8,
    }


def _answered(prompts: list[str]) -> AnsweredJson:
    return {
        "prompts": prompts,
        "answers": ["a0", "a2"][: len(prompts)],
        "answer_tokens": [8, 3][: len(prompts)],
        "stopped_at_eos": 1,
        "answered_by": "the target with 'd' as its draft, greedy (lossless)",
        "answer_s": 1.0,
    }


def test_asked_turns_name_the_prompt_they_follow() -> None:
    assert asked_turns(["p0", "p1", "p2"], ["s0", None, "s2"]) == [
        {"prompt": 0, "first": "p0", "second": "s0"},
        {"prompt": 2, "first": "p2", "second": "s2"},
    ]
    with pytest.raises(ValueError, match="1 follow-ups for 2 prompts"):
        asked_turns(["a", "b"], ["x"])


def test_the_first_engine_answers_and_every_later_one_measures_its_conversations() -> None:
    turns = SecondTurns(_asked())
    rendered = RenderedPrompts(["p0", "p1", "p2"], False, turns)
    assert rendered.for_engine() == ["p0", "p1", "p2"] and turns.pending() == _asked()
    turns.adopt({"token_ids": []})  # an engine that answered nothing changes nothing
    assert turns.pending() is not None and turns.record(3) is None
    turns.adopt({"second_turns": _answered(["c0", "c2"])})
    assert turns.pending() is None
    assert rendered.for_engine() == ["p0", "p1", "p2", "c0", "c2"]
    assert rendered.measured() == RenderedPrompts(["p0", "p1", "p2", "c0", "c2"], False)
    turns.adopt({"second_turns": _answered(["other", "other"])})  # the first answers stand
    assert rendered.for_engine()[3:] == ["c0", "c2"]
    record = turns.record(3)
    assert record == {
        "first_turns": 3,
        "of": [0, 2],
        "answered_by": "the target with 'd' as its draft, greedy (lossless)",
        "answer_cap": 8,
        "answer_tokens_mean": 5.5,
        "answer_tokens_max": 8,
        "stopped_at_eos": 1,
    }
    assert describe(record).startswith(
        "Second turns: prompts 4-5 are the second turns of 2 of the 3 prompts"
    )
    with pytest.raises(ValueError, match="answered 1 of 2 first turns"):
        SecondTurns(_asked()).adopt({"second_turns": _answered(["c0"])})


def test_engine_requests_carry_the_asked_turns() -> None:
    request = EngineRequest(llm={"model": "t"}, prompts=["p"], max_tokens=4, second_turns=_asked())
    assert EngineRequest.from_json(request.to_json()) == request
    assert EngineRequest(llm={}, prompts=[], max_tokens=1).to_json()["second_turns"] is None


def _request(**changes: object) -> ValidateRequest:
    settings: dict = {
        "target": TOY / "target",
        "draft": TOY / "draft",
        "baseline": TOY / "draft",
        "prompts": ["p0", "p1", "p2"],
        "categories": ["x", "y", "x"],
        "followups": ["s0", None, "s2"],
        "max_tokens": 8,
    }
    return ValidateRequest(**(settings | changes))


def test_validate_asks_its_first_engine_for_the_second_turns() -> None:
    rendered = engine_prompts(_request())
    assert rendered.texts == ["p0", "p1", "p2"] and rendered.second_turns is not None
    asked = rendered.second_turns.asked
    assert [t["prompt"] for t in asked["turns"]] == [0, 2] and asked["max_tokens"] == 8
    assert asked["tokenizer"] == str(TOY / "target") and not asked["chat_template"]
    assert engine_prompts(_request(followups=None)).second_turns is None


def test_answered_second_turns_are_measured_in_their_prompts_category() -> None:
    request = _request()
    rendered = engine_prompts(request)
    assert measured_request(request, rendered) is request  # nothing answered yet
    assert rendered.second_turns is not None
    rendered.second_turns.adopt({"second_turns": _answered(["c0", "c2"])})
    measured = measured_request(request, rendered)
    assert measured.prompts == ["p0", "p1", "p2", "c0", "c2"]
    assert measured.categories == ["x", "y", "x", "x", "x"]
    uncategorised = measured_request(_request(categories=None), rendered)
    assert uncategorised.categories is None and len(uncategorised.prompts) == 5


def test_second_turns_that_outgrow_the_context_are_refused_before_an_engine(
    chat_target: Path,
) -> None:
    request = _request(target=chat_target, prompts=["hi", "x"], followups=["more?", None])
    rendered = engine_prompts(request)
    cpu = VllmInstall("cpu", frozenset())
    # "<s><|user|>hi<|end|><|assistant|><|end|><|user|>more?<|end|><|assistant|>": 71 tokens
    check = {"engine": EngineOptions(), "install": cpu, "source": "p.jsonl"}
    check_second_turn_lengths(chat_target, rendered, max_tokens=28, **check)  # 71 + 56 < 128
    with pytest.raises(InputError) as refused:
        check_second_turn_lengths(chat_target, rendered, max_tokens=29, **check)
    assert str(refused.value) == (
        "p.jsonl: prompt 1's second turn is 71 tokens before its answer; with an answer of up "
        "to 29 tokens and 29 generated it needs 129, beyond the engines' context of 128 tokens "
        "(eaglequant's CPU default); pass --max-model-len 256 or a smaller --max-tokens"
    )


def test_second_turns_need_prompts_that_have_them(tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"text": "a"}) + "\n")
    args = ["validate", "--target", str(TOY / "target"), "--draft", str(TOY / "draft")]
    args += ["--baseline", str(TOY / "draft"), "--prompts", str(prompts), "--second-turns"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    assert result.output.strip() == (
        f"error: {prompts}: no prompt has a second turn; --second-turns needs a set with them "
        "(mt-bench) or a .jsonl whose records have two 'turns'"
    )
    assert read_prompt_file(prompts) == [Prompt("a")]


def test_validate_help_lists_second_turns_under_prompts() -> None:
    text = CliRunner().invoke(main, ["validate", "--help"]).output
    prompts_section = text.split("\nPrompts:\n")[1].split("\nEngine:\n")[0]
    assert "--second-turns" in prompts_section
