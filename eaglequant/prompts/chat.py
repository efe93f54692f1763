"""Prompts as the target sees them: through its chat template, as ``vllm serve``'s chat endpoint.

The endpoint renders one user message with ``add_generation_prompt=True`` and
tokenizes the result without adding special tokens (the template writes its
own BOS); a raw prompt is tokenized with them, as the completions endpoint and
``LLM.generate`` do. :class:`RenderedPrompts` carries both the texts and that
choice, so every engine and the scale check tokenize the same way, and the second turns
asked of the engines (:mod:`eaglequant.prompts.turns`), once answered.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eaglequant.prompts.turns import SecondTurns


@dataclass(frozen=True)
class RenderedPrompts:
    """The prompts as rendered; ``second_turns``: their follow-ups, answered in place by the
    first engine that runs (None: first turns only)."""

    texts: list[str]
    chat_template: bool
    second_turns: SecondTurns | None = None

    @property
    def add_special_tokens(self) -> bool:
        return not self.chat_template

    def for_engine(self) -> list[str]:
        """What the next engine is given: the prompts, then the second turns once answered
        (until then the engine is asked to answer them: ``second_turns.pending()``)."""
        answered = self.second_turns.answered if self.second_turns else None
        return self.texts + (answered["prompts"] if answered else [])

    def measured(self) -> RenderedPrompts:
        """Every prompt the engines measured, the answered second turns after the first."""
        return RenderedPrompts(self.for_engine(), self.chat_template)


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def render(texts: list[str], tokenizer: Any, use_template: bool) -> RenderedPrompts:
    """Each text as one user turn of ``tokenizer``'s chat template, when asked and it has one."""
    if not (use_template and has_chat_template(tokenizer)):
        return RenderedPrompts(list(texts), chat_template=False)
    rendered = [
        str(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
            )
        )
        for text in texts
    ]
    return RenderedPrompts(rendered, chat_template=True)


def render_for_target(
    target: Path, texts: list[str], use_template: bool, trust_remote_code: bool = False
) -> RenderedPrompts:
    # lazy: torch-free core
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target, trust_remote_code=trust_remote_code)
    return render(texts, tokenizer, use_template)


def token_counts(target: Path, rendered: RenderedPrompts) -> list[int]:
    """Each rendered prompt's length in the target's tokens, as the engines tokenize it."""
    # lazy: torch-free core
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target)
    encoded = tokenizer(rendered.texts, add_special_tokens=rendered.add_special_tokens)
    return [len(ids) for ids in encoded["input_ids"]]
