"""Proof of the conversion: vLLM's greedy tokens from the converted checkpoint against
transformers' from the GGUF file itself, on chat prompts.

Run as a child (``python -m eaglequant.examples.conversion_check TARGET GGUF OUT``);
it writes one JSON object to OUT: per prompt, both token lists and the first
position where they differ (None where equal).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

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


def gguf_tokens(gguf: Path, prompts: tuple[str, ...], max_tokens: int) -> list[list[int]]:
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
            out = model.generate(ids, max_new_tokens=max_tokens, do_sample=False)
        tokens.append(out[0, ids.shape[1] :].tolist())
    return tokens


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare(target: Path, gguf: Path) -> dict[str, Any]:
    served = vllm_tokens(target, PROMPTS, MAX_TOKENS)
    reference = gguf_tokens(gguf, PROMPTS, MAX_TOKENS)
    return {
        "max_tokens": MAX_TOKENS,
        "prompts": [
            {"prompt": p, "vllm": s, "gguf": r, "first_difference": first_difference(s, r)}
            for p, s, r in zip(PROMPTS, served, reference, strict=True)
        ],
    }


if __name__ == "__main__":
    result = compare(Path(sys.argv[1]), Path(sys.argv[2]))
    Path(sys.argv[3]).write_text(json.dumps(result, indent=2) + "\n")
