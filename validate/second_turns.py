"""Second turns in an engine child: the target's own answers to the first turns, generated
before the measured runs, and the conversations they make (:mod:`eaglequant.prompts.turns`).

The answers are the engine's greedy output, stopping at EOS (or ``max_tokens``): the target
alone's, or the target's with a draft, which speculative decoding keeps lossless (check 1
proves it on the measured runs). The answers' spec-decode counts and prefix-cache blocks are
not the measured runs': the caller takes the counters after :func:`answer_first_turns` as its
baseline, and the prefix cache is reset, so the first measured run reads no block the answers
wrote (as after a draft swap).

Before any engine starts, :func:`check_second_turn_lengths` refuses second turns that could
outgrow the engines' context: the first turn, an answer of ``max_tokens``, the second turn and
``max_tokens`` generated.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eaglequant.engine.child_request import EngineRequest
from eaglequant.errors import InputError
from eaglequant.prompts.chat import RenderedPrompts
from eaglequant.prompts.chat import token_counts as count_tokens
from eaglequant.prompts.turns import AnsweredJson, second_turn_text
from eaglequant.validate.prompt_lengths import context_length

if TYPE_CHECKING:
    from eaglequant.engine.config import EngineOptions, VllmInstall
    from eaglequant.prompts.chat import RenderedPrompts
    from eaglequant.validate.request import ValidateRequest


def answer_first_turns(
    llm: Any, request: EngineRequest, kwargs: dict[str, Any]
) -> tuple[EngineRequest, AnsweredJson | None]:
    """In the engine child: the request with its answered second turns after its prompts, and
    what answered them (the request as it is, and None, when it asks for none)."""
    asked = request.second_turns
    if asked is None:
        return request, None
    # lazy: torch-free core
    from transformers import AutoTokenizer

    # lazy: vllm is an optional extra
    from vllm import SamplingParams

    began = time.perf_counter()
    firsts = [request.prompts[turn["prompt"]] for turn in asked["turns"]]
    params = SamplingParams(temperature=0.0, max_tokens=asked["max_tokens"])
    outputs = llm.generate(
        firsts,
        params,
        use_tqdm=False,
        tokenization_kwargs={"add_special_tokens": request.add_special_tokens},
    )
    answers = [o.outputs[0].text for o in outputs]
    tokenizer = AutoTokenizer.from_pretrained(
        asked["tokenizer"], trust_remote_code=asked["trust_remote_code"]
    )
    conversations = [
        second_turn_text(
            tokenizer, asked["chat_template"], turn["first"], rendered, answer, turn["second"]
        )
        for turn, rendered, answer in zip(asked["turns"], firsts, answers, strict=True)
    ]
    if not llm.reset_prefix_cache():
        raise RuntimeError("vLLM did not reset the prefix cache after the first-turn answers")
    answered: AnsweredJson = {
        "prompts": conversations,
        "answers": answers,
        "answer_tokens": [len(o.outputs[0].token_ids) for o in outputs],
        "stopped_at_eos": sum(1 for o in outputs if o.outputs[0].finish_reason == "stop"),
        "answered_by": _answered_by(kwargs),
        "answer_s": round(time.perf_counter() - began, 2),
    }
    extended = replace(request, prompts=[*request.prompts, *conversations], second_turns=None)
    return extended, answered


def _answered_by(kwargs: dict[str, Any]) -> str:
    speculative = kwargs.get("speculative_config")
    if not speculative:
        return "the target alone, greedy"
    return f"the target with {Path(speculative['model']).name!r} as its draft, greedy (lossless)"


def check_second_turn_lengths(
    target: Path,
    rendered: RenderedPrompts,
    *,
    max_tokens: int,
    engine: EngineOptions,
    install: VllmInstall,
    source: str,
) -> None:
    """InputError naming the longest second turn when one, with an answer of ``max_tokens``
    and ``max_tokens`` generated after it, would reach the engines' context."""
    # lazy: torch-free core
    from transformers import AutoTokenizer

    asked = rendered.second_turns.asked if rendered.second_turns else None
    limit, why = context_length(target, engine, install)
    if asked is None or not limit or not asked["turns"]:
        return
    tokenizer = AutoTokenizer.from_pretrained(
        asked["tokenizer"], trust_remote_code=asked["trust_remote_code"]
    )
    empty = [
        second_turn_text(
            tokenizer,
            asked["chat_template"],
            turn["first"],
            rendered.texts[turn["prompt"]],
            "",
            turn["second"],
        )
        for turn in asked["turns"]
    ]
    counts = count_tokens(target, RenderedPrompts(empty, rendered.chat_template))
    longest = max(range(len(counts)), key=counts.__getitem__)
    needed = counts[longest] + 2 * max_tokens
    if needed <= limit:
        return
    prompt = asked["turns"][longest]["prompt"] + 1
    raise InputError(
        f"{source}: prompt {prompt}'s second turn is {counts[longest]} tokens before its answer; "
        f"with an answer of up to {max_tokens} tokens and {max_tokens} generated it needs "
        f"{needed}, beyond the engines' context of {limit} tokens ({why}); pass --max-model-len "
        f"{1 << needed.bit_length()} or a smaller --max-tokens"
    )


def measured_request(request: ValidateRequest, rendered: RenderedPrompts) -> ValidateRequest:
    """``request`` for the checks after the engines: its prompts and categories with the answered
    second turns after them (each conversation as rendered, in its prompt's category); the
    request as it is when none were asked or none answered."""
    turns = rendered.second_turns
    if turns is None or turns.answered is None:
        return request
    of = turns.of()
    categories = request.categories
    return replace(
        request,
        prompts=[*request.prompts, *turns.answered["prompts"]],
        categories=None if categories is None else [*categories, *(categories[i] for i in of)],
        followups=None,
    )
