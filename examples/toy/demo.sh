#!/usr/bin/env bash
# The main job on the embedded toy pair: export (static FP8, calibrated with the toy
# target), inspect the result, validate it in vLLM against the BF16 draft.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-out/demo}
EQ=.venv/bin/eaglequant
TOY=examples/toy
mkdir -p "$(dirname "$OUT")"
rm -rf "$OUT"
mkdir -p "$OUT"
echo "== eaglequant export (static FP8 E4M3, calibrated on the toy target)"
$EQ export $TOY/draft "$OUT/draft-fp8" \
  --calib-target $TOY/target --calib-data $TOY/calibration.jsonl 2>"$OUT/export.log" \
  || { tail -20 "$OUT/export.log"; exit 1; }
echo "== eaglequant inspect"
$EQ inspect "$OUT/draft-fp8" --target-layers 4
echo "== eaglequant validate (vLLM speculative decoding, k=3, FP8 vs BF16 draft)"
$EQ validate --target $TOY/target --draft "$OUT/draft-fp8" --baseline $TOY/draft \
  --prompts $TOY/prompts.jsonl --k 3 \
  --json "$OUT/validation.json" --markdown "$OUT/validation.md" 2>"$OUT/validate.log"
echo "reports: $OUT/validation.json $OUT/validation.md"
