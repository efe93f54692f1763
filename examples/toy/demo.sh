#!/usr/bin/env bash
# The main job on the embedded toy pair: capture the toy target's hidden states on vLLM
# once, export (static FP8, calibrated on them), inspect the result, validate it in vLLM
# against the BF16 draft (check 6 reads the same capture), write its model card and check
# that publishing would be allowed (a dry run: nothing leaves the machine).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-out/demo}
EQ=.venv/bin/eaglequant
TOY=examples/toy
mkdir -p "$(dirname "$OUT")"
rm -rf "$OUT"
mkdir -p "$OUT"
echo "== eaglequant capture (the toy target's hidden states, on vLLM)"
SUMMARY='import json,sys; c=json.load(sys.stdin); print(c["sequences"], "sequences x", c["seq_len"], "tokens, aux layers", c["aux_layer_ids"], "captured at", c["tokens_per_s"], "tok/s")'
$EQ capture --target $TOY/target --data $TOY/calibration.jsonl "$OUT/capture" \
  --draft $TOY/draft 2>"$OUT/capture.log" | .venv/bin/python -c "$SUMMARY" \
  || { tail -20 "$OUT/capture.log"; exit 1; }
echo "== eaglequant export (static FP8 E4M3, calibrated on the captured states)"
$EQ export $TOY/draft "$OUT/draft-fp8" --calib-hidden-states "$OUT/capture" \
  2>"$OUT/export.log" || { tail -20 "$OUT/export.log"; exit 1; }
echo "== eaglequant inspect"
$EQ inspect "$OUT/draft-fp8" --target-layers 4
echo "== eaglequant validate (vLLM speculative decoding, k=3, FP8 vs BF16 draft)"
$EQ validate --target $TOY/target --draft "$OUT/draft-fp8" --baseline $TOY/draft \
  --prompts $TOY/prompts.jsonl --k 3 --max-tokens 48 --hidden-states "$OUT/capture" \
  --json "$OUT/validation.json" --markdown "$OUT/validation.md" 2>"$OUT/validate.log"
echo "reports: $OUT/validation.json $OUT/validation.md"
echo "== eaglequant card (for the Hub repository example/toy-eagle3-fp8)"
REPO_ID=example/toy-eagle3-fp8
$EQ card "$OUT/draft-fp8" --base-model example/toy-target --repo-id $REPO_ID \
  --validation "$OUT/validation.json"
CARD="$OUT/draft-fp8/README.md"
# The card is published: it must not name this machine's paths or local folder names.
bash examples/card_is_public.sh "$CARD" $REPO_ID "$PWD" "$OUT" "$TOY" "draft-fp8"
echo "== eaglequant publish --dry-run (every gate, nothing sent)"
$EQ publish "$OUT/draft-fp8" --repo-id $REPO_ID --validation "$OUT/validation.json" --dry-run
