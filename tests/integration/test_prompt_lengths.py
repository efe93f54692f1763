"""A prompt the engine would refuse is refused before any export or engine, by name."""

from __future__ import annotations

import pytest

from eaglequant.engine.config import EngineOptions, VllmInstall
from eaglequant.errors import InputError
from eaglequant.prompts.chat import RenderedPrompts, token_counts
from eaglequant.validate.prompt_lengths import check_prompt_lengths, context_length
from tests.conftest import TOY

CPU = VllmInstall(device_type="cpu", engine_args=frozenset())
GPU = VllmInstall(device_type="cuda", engine_args=frozenset())


def test_the_longest_prompt_is_named_with_the_context_it_reaches() -> None:
    rendered = RenderedPrompts(["def f(x):", "x = 1\n" * 400, "y = 2"], chat_template=False)
    counts = token_counts(TOY / "target", rendered)
    assert counts[1] > 1024 > counts[0]
    with pytest.raises(InputError) as caught:
        check_prompt_lengths(
            TOY / "target", rendered, engine=EngineOptions(), install=CPU, source="set.jsonl"
        )
    assert str(caught.value) == (
        f"set.jsonl: prompt 2 is {counts[1]} tokens; 1 of 3 prompts reach the engines' context "
        "of 1024 tokens (eaglequant's CPU default), which vLLM refuses; pass --max-model-len "
        f"{1 << counts[1].bit_length()} or leave the longest prompts out"
    )
    # asked for a longer context, it passes; on a GPU the target's own context applies
    longer = EngineOptions(max_model_len=4096)
    check_prompt_lengths(TOY / "target", rendered, engine=longer, install=CPU, source="s")
    assert context_length(TOY / "target", EngineOptions(), GPU) == (
        2048,
        "the target's max_position_embeddings",
    )
    assert (
        context_length(TOY / "target", EngineOptions(engine_args={"max_model_len": 64}), CPU)[0]
        == 64
    )
