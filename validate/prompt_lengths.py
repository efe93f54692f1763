"""Refuse, before any export or engine, a prompt the engine would refuse.

vLLM rejects a prompt as long as the model's context or longer ("This model's maximum context
length is N tokens. However, your prompt contains at least M input tokens ..."). On a CPU
eaglequant's engines run with a short context unless one is asked for
(``engine.config.CPU_MAX_MODEL_LEN``), and real prompt sets (ShareGPT's long turns, rendered
through a chat template) pass it. Found in the engine, that costs every export and engine
start before it; found here it costs one tokenizer load.
"""

from __future__ import annotations

from pathlib import Path

from eaglequant.engine.config import CPU_MAX_MODEL_LEN, EngineOptions, VllmInstall
from eaglequant.errors import InputError
from eaglequant.io.checkpoint import read_config
from eaglequant.prompts.chat import RenderedPrompts, token_counts


def context_length(target: Path, engine: EngineOptions, install: VllmInstall) -> tuple[int, str]:
    """The context the engines will run with, and where it comes from."""
    asked = engine.max_model_len or engine.engine_args.get("max_model_len")
    if asked:
        return int(asked), "--max-model-len"
    config = read_config(target)
    model = config.get("text_config", config).get("max_position_embeddings")
    if install.on_cpu:
        limit = min(CPU_MAX_MODEL_LEN, model) if isinstance(model, int) else CPU_MAX_MODEL_LEN
        return limit, "eaglequant's CPU default"
    if isinstance(model, int):
        return model, "the target's max_position_embeddings"
    return 0, ""


def check_prompt_lengths(
    target: Path,
    rendered: RenderedPrompts,
    *,
    engine: EngineOptions,
    install: VllmInstall,
    source: str,
) -> None:
    """InputError naming the longest prompt when any reaches the engines' context."""
    limit, why = context_length(target, engine, install)
    if not limit or not rendered.texts:
        return
    counts = token_counts(target, rendered)
    longest = max(range(len(counts)), key=counts.__getitem__)
    if counts[longest] < limit:
        return
    over = sum(1 for count in counts if count >= limit)
    rendering = " with the chat template" if rendered.chat_template else ""
    needed = 1 << counts[longest].bit_length()  # the next power of two above it
    raise InputError(
        f"{source}: prompt {longest + 1} is {counts[longest]} tokens{rendering}; {over} of "
        f"{len(counts)} prompts reach the engines' context of {limit} tokens ({why}), which "
        f"vLLM refuses; pass --max-model-len {needed} or leave the longest prompts out"
    )
