"""Proof of the conversion: vLLM's greedy tokens from the converted checkpoint against
transformers' from the GGUF file itself, on chat prompts.

Run as a child (``python -m eaglequant_examples.conversion_check TARGET GGUF OUT``);
it writes one JSON object to OUT: per prompt, both token lists, the first
position where they differ (None where equal) and the GGUF's own top-2 logprob
margin there. Rounding the weights to BF16 may flip a near-tie, so the tokens
agree when they are equal, or equal up to a position whose margin is below
validate's tie margin (after which greedy decoding may go either way).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from eaglequant_examples.records import ConversionCheck, ConversionRow

PROMPTS = (
    "Write a Python function that checks whether a string is a palindrome.",
    "What is the capital of France? Answer in one sentence.",
    "Give three tips for staying focused while studying.",
    "Explain what a hash table is to a beginner.",
)
MAX_TOKENS = 32


def vllm_tokens(target: Path, prompts: tuple[str, ...], max_tokens: int) -> list[list[int]]:
    from vllm import LLM, SamplingParams

    llm = LLM(str(target), dtype="bfloat16", max_model_len=1024, seed=0)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    outs = llm.chat([[{"role": "user", "content": p}] for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def gguf_tokens(
    gguf: Path, prompts: tuple[str, ...], max_tokens: int
) -> list[tuple[list[int], list[float]]]:
    """transformers' greedy tokens from the GGUF file (float32) and each step's top-2 margin."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    ).eval()
    tokens = []
    for prompt in prompts:
        rendered: Any = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}],
            add_generation_prompt=True,
            return_dict=True,
            return_tensors="pt",
        )
        ids = rendered["input_ids"]
        with torch.no_grad():
            out = model.generate(
                ids,
                max_new_tokens=max_tokens,
                do_sample=False,
                output_scores=True,
                return_dict_in_generate=True,
            )
        margins = []
        for scores in out.scores:
            top = scores[0].float().log_softmax(-1).topk(2).values
            margins.append(round(float(top[0] - top[1]), 4))
        tokens.append((out.sequences[0, ids.shape[1] :].tolist(), margins))
    return tokens


def compare(target: Path, gguf: Path) -> ConversionCheck:
    from eaglequant.validate.lossless import DEFAULT_TIE_MARGIN, first_difference

    served = vllm_tokens(target, PROMPTS, MAX_TOKENS)
    reference = gguf_tokens(gguf, PROMPTS, MAX_TOKENS)
    rows: list[ConversionRow] = []
    for prompt, tokens, (expected, margins) in zip(PROMPTS, served, reference, strict=True):
        at = first_difference(expected, tokens)
        margin = margins[at] if at is not None and at < len(margins) else None
        rows.append(
            {
                "prompt": prompt,
                "vllm": tokens,
                "gguf": expected,
                "first_difference": at,
                "gguf_margin_there": margin,
                "agrees": at is None or (margin is not None and margin < DEFAULT_TIE_MARGIN),
            }
        )
    return {"max_tokens": MAX_TOKENS, "tie_margin": DEFAULT_TIE_MARGIN, "prompts": rows}


if __name__ == "__main__":
    result = compare(Path(sys.argv[1]), Path(sys.argv[2]))
    Path(sys.argv[3]).write_text(json.dumps(result, indent=2) + "\n")
