"""``validate --second-turns`` on the toy pair: each second turn asked after the engine's own
answer, through the target's chat template, measured and counted in its prompt's category.

The toy target is copied with a chat template (it has none), so the conversations go through
one. Four prompts (three with a second turn) x 16 tokens: one shared engine, ~1 min on 2 cores.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from click.testing import CliRunner
from transformers import AutoTokenizer

from eaglequant.cli import main
from eaglequant.prompts.format import read_prompts
from eaglequant.results.validation_report import prompts_digest, read_report
from tests.conftest import TOY

TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
MAX_TOKENS = 16


def _chat_target(folder: Path) -> Path:
    target = shutil.copytree(TOY / "target", folder / "target")
    config_path = target / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps(config | {"chat_template": TEMPLATE}))
    return target


def test_second_turns_follow_the_engines_own_answers(toy_fp8: Path, tmp_path: Path) -> None:
    code = read_prompts(TOY / "prompts.jsonl")
    records = [
        {"turns": [code[0], code[4]], "category": "a"},
        {"turns": [code[1], code[5]], "category": "b"},
        {"text": code[2], "category": "a"},
        {"turns": [code[3], code[6]], "category": "b"},
    ]
    prompts = tmp_path / "turns.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in records))
    target = _chat_target(tmp_path)
    report_path, markdown = tmp_path / "report.json", tmp_path / "report.md"
    args = ["validate", "--target", str(target), "--draft", str(toy_fp8)]
    args += ["--baseline", str(TOY / "draft"), "--prompts", str(prompts), "--second-turns"]
    args += ["--max-tokens", str(MAX_TOKENS), "--json", str(report_path)]
    result = CliRunner().invoke(main, [*args, "--markdown", str(markdown)])
    assert result.exit_code in (0, 1), result.output
    report = read_report(report_path)

    assert report.prompts == 7 and report.chat_template
    assert report.second_turns is not None
    assert report.second_turns["first_turns"] == 4 and report.second_turns["of"] == [0, 1, 3]
    assert "with 'draft' as its draft" in report.second_turns["answered_by"]
    assert report.second_turns["answer_cap"] == MAX_TOKENS
    bf16, fp8 = report.engines["bf16"], report.engines["fp8"]
    assert bf16.token_ids is not None and fp8.token_ids is not None
    assert len(bf16.token_ids) == len(fp8.token_ids) == 7
    assert bf16.per_prompt is not None and all(p is not None for p in bf16.per_prompt)

    # The conversations the engines measured, rebuilt from the report's own first-turn outputs
    # (greedy, so the answer that stopped at EOS is their prefix) through the chat template.
    tokenizer = AutoTokenizer.from_pretrained(target)
    eos = tokenizer.eos_token_id
    firsts = [r["turns"][0] if "turns" in r else r["text"] for r in records]
    conversations = []
    lengths = []
    for index in (0, 1, 3):
        ids = bf16.token_ids[index]
        answer_ids = ids[: ids.index(eos)] if eos in ids else ids
        lengths.append(len(answer_ids) + (eos in ids))
        answer = tokenizer.decode(answer_ids, skip_special_tokens=True)
        messages = [
            {"role": "user", "content": records[index]["turns"][0]},
            {"role": "assistant", "content": answer},
            {"role": "user", "content": records[index]["turns"][1]},
        ]
        conversations.append(
            tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        )
    assert all(c.startswith("<|user|>") and c.endswith("<|assistant|>") for c in conversations)
    assert report.prompts_sha256 == prompts_digest(firsts + conversations)
    assert report.second_turns["answer_tokens_max"] == max(lengths)

    # Counted: each second turn in its prompt's category.
    assert report.categories is not None
    assert {name: row.prompts for name, row in report.categories.items()} == {"a": 3, "b": 4}
    assert report.prompt_categories == ["a", "b", "a", "b", "a", "b", "b"]
    assert "prompts 5-7 are the second turns of 3 of the 4 prompts" in markdown.read_text()
