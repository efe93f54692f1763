"""inspect and fix-config on drafts other producers write: ModelOpt, llm-compressor, fp8."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from eaglequant_examples.synthetic import draft_config, write_random_draft
from tests.conftest import tree_digest
from tests.foreign import (
    MIDLAYER,
    compressed_tensors_config,
    fp8_args,
    fp8_dynamic_draft,
    modelopt_config,
    modelopt_fp8_draft,
    quantize_layers,
    set_quantization_config,
)
from tests.support import invoke

QKV = "model.layers.32.self_attn.qkv_proj"


def problems(folder: Path) -> tuple[int, list[str]]:
    code, output = invoke(["inspect", str(folder), "--json"])
    return code, json.loads(output)["problems"]


def fates(folder: Path) -> dict[str, dict]:
    _, output = invoke(["inspect", str(folder), "--json"])
    return {f["vllm_name"]: f for f in json.loads(output)["fates"]}


def test_fp8_dynamic_draft_is_clean_and_built_as_it_declares(tiny_draft: Path) -> None:
    fp8_dynamic_draft(tiny_draft)
    code, output = invoke(["inspect", str(tiny_draft)])
    assert code == 0, output
    assert "no problems found" in output and "kv_cache_group" not in output
    found = fates(tiny_draft)
    assert found[QKV]["vllm_scheme"] == "CompressedTensorsW8A8Fp8"
    assert found[QKV]["weight_dtype"] == "float8_e4m3fn"
    assert found["model.fc"]["quantized"] is False
    assert found["model.fc"]["reason"] == "matched by ignore"


def test_plain_ignore_fc_names_fc_and_fix_config_repairs_the_ignore_list(tiny_draft: Path) -> None:
    fp8_dynamic_draft(tiny_draft, ["lm_head", "fc", "embed_tokens"])
    code, found = problems(tiny_draft)
    assert code == 1
    assert found == [
        f"{tiny_draft / 'config.json'}: ignore entry 'fc' matches no vLLM module; vLLM would "
        f"quantize model.fc; run `eaglequant fix-config {tiny_draft}`",
        "model.fc: vLLM would build it as fp8 w:channel a:token dynamic but 'fc.weight' is BF16 "
        "(vLLM loads it into a quantized layer with placeholder scales); exclude it in ignore: "
        f"run `eaglequant fix-config {tiny_draft}`",
    ]
    code, output = invoke(["fix-config", str(tiny_draft)])
    assert code == 0, output
    assert output == (
        "rewrote ignore ['lm_head', 'fc', 'embed_tokens'] -> ['lm_head', 're:.*fc.*', "
        f"'embed_tokens'] in {tiny_draft}\n"
    )
    qcfg = json.loads((tiny_draft / "config.json").read_text())["quantization_config"]
    assert "exclude" not in qcfg and "export" not in qcfg  # no Quark key added
    assert problems(tiny_draft) == (0, [])
    before = tree_digest(tiny_draft)
    code, output = invoke(["fix-config", str(tiny_draft)])
    assert output == (
        "already correct, unchanged: ignore ['lm_head', 're:.*fc.*', 'embed_tokens'] in "
        f"{tiny_draft}\n"
    )
    assert tree_digest(tiny_draft) == before


def test_a_good_foreign_draft_is_left_alone_by_fix_config(tiny_draft: Path) -> None:
    fp8_dynamic_draft(tiny_draft)
    before = tree_digest(tiny_draft)
    code, output = invoke(["fix-config", str(tiny_draft)])
    assert code == 0
    assert output.startswith("already correct, unchanged: ignore ['lm_head', 're:.*fc.*'")
    assert tree_digest(tiny_draft) == before


def test_modelopt_quantized_fc_is_what_it_declares(tiny_draft: Path) -> None:
    modelopt_fp8_draft(tiny_draft)
    assert problems(tiny_draft) == (0, [])
    fc = fates(tiny_draft)["model.fc"]
    assert fc["quantized"] and fc["linear_method"] == "ModelOptLinearMethod"
    assert fc["scheme"] == "fp8 w:per_tensor a:per_tensor static"
    assert fates(tiny_draft)["lm_head"]["quantized"] is False


def test_modelopt_head_left_out_of_ignore_is_built_fp8_and_fix_config_adds_it(
    tiny_draft: Path,
) -> None:
    modelopt_fp8_draft(tiny_draft)
    set_quantization_config(tiny_draft, modelopt_config(["*embed_tokens*"]))
    code, found = problems(tiny_draft)
    assert code == 1
    assert found == [
        "lm_head: vLLM would build it as fp8 w:per_tensor a:per_tensor static but "
        "'lm_head.weight' is BF16 (vLLM loads it into a quantized layer with placeholder "
        f"scales); exclude it in ignore: run `eaglequant fix-config {tiny_draft}`"
    ]
    code, output = invoke(["fix-config", str(tiny_draft)])
    assert output == (
        f"rewrote ignore ['*embed_tokens*'] -> ['*embed_tokens*', 'lm_head'] in {tiny_draft}\n"
    )
    assert problems(tiny_draft) == (0, [])


def test_modelopt_static_layer_without_its_input_scale_is_named(tiny_draft: Path) -> None:
    from safetensors.torch import load_file, save_file

    modelopt_fp8_draft(tiny_draft)
    tensors = load_file(str(tiny_draft / "model.safetensors"))
    del tensors["fc.input_scale"]
    save_file(tensors, str(tiny_draft / "model.safetensors"), metadata={"format": "pt"})
    assert problems(tiny_draft) == (
        1,
        [
            f"{tiny_draft}: tensor 'fc.input_scale' is missing; vLLM would load a placeholder "
            "(-3.4e38) scale; re-export the draft"
        ],
    )


def test_fix_config_never_excludes_a_layer_stored_quantized(tiny_draft: Path) -> None:
    modelopt_fp8_draft(tiny_draft)
    set_quantization_config(tiny_draft, modelopt_config(["fc", "lm_head"]))
    code, found = problems(tiny_draft)
    assert code == 1
    assert found == [
        "model.fc: 'fc.weight' is F8_E4M3 but vLLM would build the layer unquantized (matched "
        f"by ignore); remove it from ignore (`eaglequant fix-config {tiny_draft}`) or re-export"
    ]
    code, output = invoke(["fix-config", str(tiny_draft)])
    assert output == f"rewrote ignore ['fc', 'lm_head'] -> ['lm_head'] in {tiny_draft}\n"
    assert problems(tiny_draft) == (0, [])


def test_float_cast_vocabulary_maps_are_named_and_restored_from_the_source(
    tmp_path: Path,
) -> None:
    source = write_random_draft(tmp_path / "bf16", draft_config(), seed=3)
    draft = modelopt_fp8_draft(shutil.copytree(source, tmp_path / "fp8"), cast_maps=True)
    code, found = problems(draft)
    fix = (
        f"restore it from the BF16 draft it was made from: `eaglequant fix-config {draft} "
        "--d2t-from BF16_DRAFT`"
    )
    assert code == 1
    assert found == [
        f"{draft / 'model.safetensors'}: tensor 'd2t': is BF16, not an integer map: vLLM copies "
        "it into its int64 draft-to-target map as it is, and a float cast changes the offsets; "
        f"{fix}",
        f"{draft / 'model.safetensors'}: tensor 't2d': is BF16, not the boolean target-to-draft "
        f"mask; {fix}",
    ]
    source_digest, out = tree_digest(source), tmp_path / "fixed"
    code, output = invoke(
        ["fix-config", str(draft), "--d2t-from", str(source), "--output", str(out)]
    )
    assert code == 0, output
    assert output.splitlines()[-1] == f"restored d2t, t2d from {source} in {out}"
    assert tree_digest(source) == source_digest
    assert problems(out) == (0, [])
    code, _ = problems(draft)
    assert code == 1  # --output leaves the input as it was


def test_d2t_from_another_draft_is_refused(tmp_path: Path) -> None:
    source = write_random_draft(tmp_path / "bf16", draft_config(), seed=3)
    other = write_random_draft(tmp_path / "other", draft_config(), seed=4)
    draft = modelopt_fp8_draft(shutil.copytree(source, tmp_path / "fp8"), cast_maps=True)
    before = tree_digest(draft)
    code, output = invoke(["fix-config", str(draft), "--d2t-from", str(other)])
    assert code == 2
    assert output.startswith(f"error: {other}: its 'd2t' cast to BF16 differs from the draft's in ")
    assert output.rstrip().endswith("entries; pass the BF16 draft the quantized one was made from")
    assert tree_digest(draft) == before


def test_block_sizes_that_do_not_divide_a_shard_are_vllms_refusal(tiny_draft: Path) -> None:
    quantize_layers(tiny_draft, MIDLAYER, weights="block", block=(128, 128))
    weights = fp8_args("block", False, block_structure=[128, 128])
    set_quantization_config(
        tiny_draft,
        compressed_tensors_config(["lm_head", "re:.*fc.*"], weights, fp8_args("group", True)),
    )
    code, found = problems(tiny_draft)
    assert code == 1
    refusal = "quantize with a block size that divides every shard, or per-channel weights"
    # gate_up's gate (128) divides; a merged layer's last shard may be ragged
    assert found == [
        f'{QKV}: vLLM would refuse it: "Weight output_partition_size = 64 is not divisible by '
        f'weight quantization block_n = 128."; {refusal}'
    ]


def test_block_sizes_that_divide_every_shard_are_clean(tiny_draft: Path) -> None:
    quantize_layers(tiny_draft, MIDLAYER, weights="block", block=(16, 16))
    weights = fp8_args("block", False, block_structure=[16, 16])
    set_quantization_config(
        tiny_draft,
        compressed_tensors_config(["lm_head", "re:.*fc.*"], weights, fp8_args("group", True)),
    )
    assert problems(tiny_draft) == (0, [])
    assert fates(tiny_draft)[QKV]["block"] == [16, 16]


def test_fp8_ignored_layers_bare_fc_is_rewritten_as_vllms_name(tiny_draft: Path) -> None:
    quantize_layers(tiny_draft, MIDLAYER)
    set_quantization_config(
        tiny_draft,
        {"quant_method": "fp8", "activation_scheme": "dynamic", "ignored_layers": ["fc"]},
    )
    code, found = problems(tiny_draft)
    assert code == 1 and found[0].endswith(
        "ignored_layers entry 'fc' matches no vLLM module; vLLM would quantize model.fc; "
        f"run `eaglequant fix-config {tiny_draft}`"
    )
    code, output = invoke(["fix-config", str(tiny_draft)])
    assert output == f"rewrote ignored_layers ['fc'] -> ['model.fc'] in {tiny_draft}\n"
    assert problems(tiny_draft) == (0, [])


def test_an_unknown_method_fails_closed(tiny_draft: Path) -> None:
    set_quantization_config(tiny_draft, {"quant_method": "gptq", "bits": 4})
    code, found = problems(tiny_draft)
    assert code == 1
    assert found == [
        f"{tiny_draft / 'config.json'}: quantization_config.quant_method 'gptq' is not one "
        "eaglequant predicts vLLM's layers for (compressed-tensors, fp8, modelopt, quark); "
        "nothing here can say how vLLM builds this draft; quantize it with one of those"
    ]


def _refusal(folder: Path, role: str) -> str:
    return (
        f"error: {folder}: already quantized (NVIDIA ModelOpt, quant_method 'modelopt') where a "
        f"BF16 draft belongs ({role}); pass the BF16 draft it was made from — use `eaglequant "
        f"inspect {folder}` or `eaglequant fix-config` on this one instead"
    )


def test_a_quantized_draft_where_a_bf16_one_belongs_is_refused_naming_its_method(
    pair: dict[str, Path], tmp_path: Path
) -> None:
    fp8 = modelopt_fp8_draft(shutil.copytree(pair["draft"], tmp_path / "fp8"))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "def f(x):"}\n')
    runs = {
        "export's input": ["export", str(fp8), str(tmp_path / "o"), "--calib", "none"],
        "compare's baseline": [
            "compare", str(fp8), "--target", str(pair["target"]), "--prompts", str(prompts),
            "--recipes", "fp8-static", "--out", str(tmp_path / "c"),
            "--calib-data", str(pair["data"]),
        ],
        "validate's baseline": [
            "validate", "--target", str(pair["target"]), "--draft", str(fp8),
            "--baseline", str(fp8), "--prompts", str(prompts),
        ],
    }  # fmt: skip
    for role, args in runs.items():
        code, output = invoke(args)
        assert code == 2, (role, output)
        assert output.strip().splitlines()[-1] == _refusal(fp8, role), output


def test_the_real_pairs_draft_in_128_blocks_is_refused_in_vllms_words(tmp_path: Path) -> None:
    """SmolLM2's draft (hidden 576: q_proj 576 wide) as llm-compressor's FP8_BLOCK lays it out."""
    from tests.conftest import REPO

    draft = shutil.copytree(REPO / "examples" / "smollm2" / "draft", tmp_path / "block")
    (draft / "recipe.json").unlink()
    quantize_layers(draft, MIDLAYER, weights="block", block=(128, 128))
    weights = fp8_args("block", False, block_structure=[128, 128])
    ignore = ["lm_head", "re:.*fc.*", "re:.*embed_tokens.*"]
    set_quantization_config(
        draft, compressed_tensors_config(ignore, weights, fp8_args("group", True))
    )
    code, found = problems(draft)
    assert code == 1
    assert found == [
        'model.layers.32.self_attn.qkv_proj: vLLM would refuse it: "Weight output_partition_size '
        '= 576 is not divisible by weight quantization block_n = 128."; quantize with a block '
        "size that divides every shard, or per-channel weights"
    ]


def test_d2t_restored_in_place_leaves_no_temporary_file(tmp_path: Path) -> None:
    source = write_random_draft(tmp_path / "bf16", draft_config(), seed=3)
    draft = modelopt_fp8_draft(shutil.copytree(source, tmp_path / "fp8"), cast_maps=True)
    code, output = invoke(["fix-config", str(draft), "--d2t-from", str(source)])
    assert code == 0, output
    assert output.splitlines() == [
        f"already correct, unchanged: ignore ['*lm_head*', '*embed_tokens*'] in {draft}",
        f"restored d2t, t2d from {source} in {draft}",
    ]
    assert sorted(p.name for p in draft.iterdir()) == ["config.json", "model.safetensors"]
    assert problems(draft) == (0, [])
    code, output = invoke(["fix-config", str(draft), "--d2t-from", str(source)])
    assert code == 2 and "nothing to restore, drop --d2t-from" in output
