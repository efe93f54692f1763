"""Bad input through the CLI: exit 2, one line naming the problem, nothing written.

The input folder is checked byte for byte afterwards.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from eaglequant.cli import main
from eaglequant.recipe import load_recipe
from tests.conftest import edit_config, tree_digest
from tests.support import assert_clean_failure, put_nan, run_cli_checked

# Capture with transformers on the tiny target (4 layers: vLLM's default ids repeat one).
TRANSFORMERS_CAPTURE = ("--engine", "transformers", "--aux-layers", "1,2,3")


def _export_with_data(pair: dict[str, Path], tmp_path: Path, data: Path) -> tuple[int, str]:
    args = [
        "export",
        str(pair["draft"]),
        str(tmp_path / "o"),
        "--calib-target",
        str(pair["target"]),
        "--calib-engine",
        "transformers",
    ]
    return run_cli_checked([*args, "--calib-data", str(data), "--calib-seq-len", "16"])


def _index_edit(edit):  # type: ignore[no-untyped-def]
    def apply(folder: Path) -> None:
        path = folder / "model.safetensors.index.json"
        index = json.loads(path.read_text())
        edit(folder, index)
        path.write_text(json.dumps(index))

    return apply


def _map(name: str, shard: str):  # type: ignore[no-untyped-def]
    return _index_edit(lambda _folder, index: index["weight_map"].__setitem__(name, shard))


def _duplicate_norm(folder: Path, index: dict) -> None:
    from safetensors.torch import save_file

    save_file(
        {"norm.weight": torch.ones(64, dtype=torch.bfloat16)},
        str(folder / "model-extra.safetensors"),
    )
    index["weight_map"]["norm.weight"] = "model-extra.safetensors"


def _stray_shard(folder: Path) -> None:
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(2)}, str(folder / "stray.safetensors"))


def _symlinked_shard(folder: Path) -> None:
    shard = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"][
        "fc.weight"
    ]
    outside = folder.parent / "outside.safetensors"
    (folder / shard).rename(outside)
    (folder / shard).symlink_to(outside)


def _rewrite_first_shard(transform):  # type: ignore[no-untyped-def]
    def apply(folder: Path) -> None:
        shard = sorted(folder.glob("model-*.safetensors"))[0]
        shard.write_bytes(transform(shard.read_bytes()))

    return apply


def _header(data: bytes) -> tuple[int, bytes, bytes]:
    length = int.from_bytes(data[:8], "little")
    return length, data[8 : 8 + length], data[8 + length :]


def _offsets_past_end(data: bytes) -> bytes:
    _, header, body = _header(data)
    parsed = json.loads(header)
    name = next(k for k in parsed if k != "__metadata__")
    begin, end = parsed[name]["data_offsets"]
    parsed[name]["data_offsets"] = [begin + len(body), end + len(body)]
    raw = json.dumps(parsed).encode()
    return len(raw).to_bytes(8, "little") + raw + body


SHARDED_CORPUS = [
    (
        "index names a missing shard",
        _map("fc.weight", "model-00099-of-00099.safetensors"),
        "which does not exist",
    ),
    (
        "shard name with ..",
        _map("fc.weight", "../x.safetensors"),
        "not a plain file name inside the model folder",
    ),
    (
        "absolute shard path",
        _map("fc.weight", "/etc/passwd"),
        "not a plain file name inside the model folder",
    ),
    ("symlink out of the folder", _symlinked_shard, "link leading outside the model folder"),
    (
        "tensor mapped to a shard lacking it",
        _map("ghost.weight", "model-00001-of-00006.safetensors"),
        "which lacks it",
    ),
    ("tensor in two shards", _index_edit(_duplicate_norm), "is stored in both"),
    ("shard not in the index", _stray_shard, "is not in the index"),
    ("truncated shard", _rewrite_first_shard(lambda d: d[: len(d) - 100]), "truncated"),
    (
        "header longer than file",
        _rewrite_first_shard(lambda d: (10**9).to_bytes(8, "little") + d[8:]),
        "exceeds the file size",
    ),
    (
        "header not JSON",
        _rewrite_first_shard(lambda d: d[:8] + b"!" + d[9:]),
        "header is not valid JSON",
    ),
    (
        "offsets out of range",
        _rewrite_first_shard(_offsets_past_end),
        "run past the end of the data",
    ),
]


@pytest.mark.parametrize(
    ("change", "pattern"),
    [
        ({"architectures": ["GPT2LMHeadModel"]}, "is not an EAGLE-3 draft"),
        (
            {"num_hidden_layers": 2},
            "tensor 'layers.1.input_layernorm.weight' is missing, which num_hidden_layers 2 "
            "requires (vLLM builds that many draft layers); set num_hidden_layers",
        ),
        ({"num_hidden_layers": None}, "num_hidden_layers is None: vLLM builds that many"),
        ({"target_hidden_size": 100}, "tensor 'fc.weight'"),
        ({"hidden_size": None}, "missing key 'hidden_size'"),
    ],
)
def test_export_refuses_bad_draft(
    tiny_draft: Path, tmp_path: Path, change: dict, pattern: str
) -> None:
    edit_config(tiny_draft, **change)
    before = tree_digest(tiny_draft)
    out = tmp_path / "out"
    code, output = run_cli_checked(["export", str(tiny_draft), str(out), "--calib", "none"])
    assert_clean_failure(code, output, pattern)
    assert not out.exists()
    assert tree_digest(tiny_draft) == before


def test_config_not_json(tiny_draft: Path, tmp_path: Path) -> None:
    (tiny_draft / "config.json").write_text("{not json")
    code, output = run_cli_checked(
        ["export", str(tiny_draft), str(tmp_path / "o"), "--calib", "none"]
    )
    assert_clean_failure(code, output, "config.json: not valid JSON")


def test_config_json_not_object(tiny_draft: Path, tmp_path: Path) -> None:
    (tiny_draft / "config.json").write_text("[1, 2]")
    code, output = run_cli_checked(
        ["export", str(tiny_draft), str(tmp_path / "o"), "--calib", "none"]
    )
    assert_clean_failure(code, output, "must hold a JSON object")


def test_output_inside_input(tiny_draft: Path) -> None:
    code, output = run_cli_checked(
        ["export", str(tiny_draft), str(tiny_draft / "fp8"), "--calib", "none"]
    )
    assert_clean_failure(code, output, "may not be the input folder")


def test_output_not_empty(tiny_draft: Path, tmp_path: Path) -> None:
    out = tmp_path / "busy"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    code, output = run_cli_checked(["export", str(tiny_draft), str(out), "--calib", "none"])
    assert_clean_failure(code, output, "pass --overwrite")
    assert (out / "keep.txt").read_text() == "mine"


def test_unparsable_shard_size(tiny_draft: Path, tmp_path: Path) -> None:
    code, output = run_cli_checked(
        [
            "export",
            str(tiny_draft),
            str(tmp_path / "o"),
            "--calib",
            "none",
            "--max-shard-size",
            "lots",
        ]
    )
    assert_clean_failure(code, output, "--max-shard-size 'lots'")


def test_static_recipe_without_calibration_source(tiny_draft: Path, tmp_path: Path) -> None:
    code, output = run_cli_checked(["export", str(tiny_draft), str(tmp_path / "o")])
    assert_clean_failure(code, output, "a static recipe needs calibration inputs")


@pytest.mark.parametrize(
    ("yaml_text", "pattern"),
    [
        ("name: x\ncalibration:\n  stepz: 3\n", "unknown key 'calibration.stepz'"),
        ("name: x\nweight:\n  granularity: per_block\n", "'weight.granularity' must be one of"),
        ("name: x\ncalibration:\n  samples: many\n", "'calibration.samples' must be int"),
        ("- a list\n", "must be a YAML mapping"),
    ],
)
def test_bad_recipe(tiny_draft: Path, tmp_path: Path, yaml_text: str, pattern: str) -> None:
    recipe = tmp_path / "bad.yaml"
    recipe.write_text(yaml_text)
    code, output = run_cli_checked(
        ["export", str(tiny_draft), str(tmp_path / "o"), "--calib", "none", "--recipe", str(recipe)]
    )
    assert_clean_failure(code, output, pattern)


@pytest.mark.parametrize("name", ["fp8-static", "ptpc-fp8"])
def test_dump_recipe_round_trips(tmp_path: Path, name: str) -> None:
    code, output = run_cli_checked(["export", "unused", "--dump-recipe", "--recipe", name])
    assert code == 0, output
    dumped = tmp_path / "dumped.yaml"
    dumped.write_text(output)
    assert load_recipe(str(dumped)) == load_recipe(name)


def test_validate_missing_target(tiny_draft: Path, tmp_path: Path) -> None:
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    code, output = run_cli_checked(
        [
            "validate",
            "--target",
            str(tmp_path / "nope"),
            "--draft",
            str(tiny_draft),
            "--baseline",
            str(tiny_draft),
            "--prompts",
            str(prompts),
        ]
    )
    assert_clean_failure(code, output, "no such target folder")


def test_validate_draft_for_another_target(tiny_draft: Path, tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(
        json.dumps({"hidden_size": 128, "vocab_size": 256, "num_hidden_layers": 4})
    )
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    code, output = run_cli_checked(
        [
            "validate",
            "--target",
            str(target),
            "--draft",
            str(tiny_draft),
            "--baseline",
            str(tiny_draft),
            "--prompts",
            str(prompts),
        ]
    )
    assert_clean_failure(
        code, output, "hidden_size 128 does not fit the draft (target_hidden_size 64)"
    )


@pytest.mark.parametrize(
    ("content", "suffix", "pattern"),
    [
        (b"", ".jsonl", "no usable text"),
        (b"\xff\xfe\x00bad", ".txt", "not UTF-8 text"),
        (b'{"other": 1}\n', ".jsonl", "calib.jsonl:1: needs a 'text' string"),
        (b"not json\n", ".jsonl", "calib.jsonl:1: not a JSON object"),
        (b"   \n\n", ".txt", "no usable text"),
        (b"hi", ".txt", "fewer than one sequence"),
    ],
)
def test_bad_calibration_data(
    pair: dict[str, Path], tmp_path: Path, content: bytes, suffix: str, pattern: str
) -> None:
    data = tmp_path / f"calib{suffix}"
    data.write_bytes(content)
    code, output = _export_with_data(pair, tmp_path, data)
    assert_clean_failure(code, output, pattern)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("change", "pattern"),
    [
        ({"hidden_size": 96}, "hidden_size 96 does not fit the draft"),
        ({"vocab_size": 1000}, "vocab_size 1000 differs"),
    ],
)
def test_calibration_target_that_does_not_fit(
    pair: dict[str, Path], tmp_path: Path, change: dict, pattern: str
) -> None:
    target = tmp_path / "target"
    target.mkdir()
    config = json.loads((pair["target"] / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, **change}))
    args = ["export", str(pair["draft"]), str(tmp_path / "o"), "--calib-target", str(target)]
    code, output = run_cli_checked([*args, "--calib-data", str(pair["data"])])
    assert_clean_failure(code, output, pattern)


def test_captured_states_of_the_wrong_width(tiny_draft: Path, tmp_path: Path) -> None:
    from eaglequant.capture.store import CalibrationData, save_capture

    capture = tmp_path / "capture"
    capture.mkdir()
    save_capture(
        capture,
        CalibrationData(torch.zeros(2, 8, dtype=torch.long), torch.zeros(2, 8, 100), "x"),
        {},
    )
    code, output = run_cli_checked(
        ["export", str(tiny_draft), str(tmp_path / "o"), "--calib-hidden-states", str(capture)]
    )
    assert_clean_failure(code, output, "has shape [2, 8, 100], the draft's fc takes width 192")


@pytest.mark.parametrize(
    ("tensor", "recipe"),
    [("lm_head.weight", ["--calib", "none"]), ("embed_tokens.weight", ["--recipe", "ptpc-fp8"])],
)
def test_nan_found_by_the_copy_is_reported_before_quark(
    tiny_draft: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tensor: str, recipe: list
) -> None:
    from eaglequant.io.writer import LayoutWriter
    from eaglequant.quantize import quark_backend

    def quark_ran(*_args: object) -> None:
        raise AssertionError("Quark ran although the copy had already found the NaN")

    # The copy finishes before the first stage, as it does on a small draft.
    monkeypatch.setattr(LayoutWriter, "start_background", lambda self, nice=0: self._run())
    monkeypatch.setattr(quark_backend, "quantize_static", quark_ran)
    monkeypatch.setattr(quark_backend, "quantize_file_to_file", quark_ran)
    put_nan(tiny_draft, tensor)
    code, output = run_cli_checked(["export", str(tiny_draft), str(tmp_path / "o"), *recipe])
    assert_clean_failure(code, output, f"tensor '{tensor}' holds 1 NaN/Inf")
    assert list(tmp_path.iterdir()) == [tiny_draft]  # Quark's worker and scratch are gone


def test_quark_worker_that_dies_is_one_line(
    tiny_draft: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from eaglequant.quantize import file_to_file

    monkeypatch.setattr(file_to_file, "WORKER", "eaglequant.no_such_worker")
    code, output = run_cli_checked(
        ["export", str(tiny_draft), str(tmp_path / "o"), "--recipe", "ptpc-fp8"]
    )
    assert code == 1, output
    assert (
        output.strip()
        .splitlines()[-1]
        .startswith("error: Quark's direct_quantize_checkpoint failed: WorkerDied: ")
    )
    assert "No module named eaglequant.no_such_worker" in output
    assert list(tmp_path.iterdir()) == [tiny_draft]


def test_capture_layers_are_parsed_by_the_cli(pair: dict[str, Path], tmp_path: Path) -> None:
    args = ["capture", "--target", str(pair["target"]), "--data", str(pair["data"])]
    code, output = run_cli_checked([*args, str(tmp_path / "c"), "--aux-layers", "1,two"])
    assert_clean_failure(code, output, "--aux-layers '1,two': give comma-separated integers")


@pytest.mark.parametrize(
    ("name", "dtype"),
    [
        ("midlayer.mlp.up_proj.weight", torch.float8_e4m3fn),
        ("midlayer.mlp.gate_proj.weight", torch.int8),
    ],
)
def test_quantized_weight_where_float_expected(
    tiny_draft: Path, tmp_path: Path, name: str, dtype: torch.dtype
) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(tiny_draft / "model.safetensors"))
    tensors[name] = tensors[name].to(dtype)
    save_file(tensors, str(tiny_draft / "model.safetensors"), metadata={"format": "pt"})
    code, output = run_cli_checked(
        ["export", str(tiny_draft), str(tmp_path / "o"), "--calib", "none"]
    )
    assert_clean_failure(code, output, f"already quantized ('{name}')")
    assert "fix-config" in output


@pytest.mark.parametrize("command", ["inspect", "export"])
def test_pickle_only_weights_refused(tmp_path: Path, command: str) -> None:
    folder = tmp_path / "pickled"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04junk")
    args = [command, str(folder)] + (
        [str(tmp_path / "o"), "--calib", "none"] if command == "export" else []
    )
    code, output = run_cli_checked(args)
    assert_clean_failure(code, output, "pickle-based weights are refused")


def test_missing_config_json(tiny_draft: Path, tmp_path: Path) -> None:
    (tiny_draft / "config.json").unlink()
    code, output = run_cli_checked(
        ["export", str(tiny_draft), str(tmp_path / "o"), "--calib", "none"]
    )
    assert_clean_failure(code, output, "config.json: missing")


@pytest.mark.parametrize(
    ("case", "corrupt", "pattern"), SHARDED_CORPUS, ids=[c[0] for c in SHARDED_CORPUS]
)
@pytest.mark.parametrize("command", ["inspect", "export"])
def test_sharded_corpus_through_the_cli(
    sharded_draft: Path,
    tmp_path: Path,
    case: str,
    corrupt,
    pattern: str,
    command: str,  # type: ignore[no-untyped-def]
) -> None:
    corrupt(sharded_draft)
    extra = [str(tmp_path / "o"), "--calib", "none"] if command == "export" else []
    code, output = run_cli_checked([command, str(sharded_draft), *extra])
    assert_clean_failure(code, output, pattern)


def test_chat_messages_go_through_the_chat_template(pair: dict[str, Path], tmp_path: Path) -> None:
    import shutil

    target = tmp_path / "target"
    shutil.copytree(pair["target"], target)
    config_path = target / "tokenizer_config.json"
    tokenizer_config = json.loads(config_path.read_text())
    tokenizer_config["chat_template"] = (
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    )
    config_path.write_text(json.dumps(tokenizer_config))
    data = tmp_path / "chat.jsonl"
    turn = [{"role": "user", "content": "def f(x): return x * 2 " * 20}]
    data.write_text("".join(json.dumps({"messages": turn}) + "\n" for _ in range(4)))
    out = tmp_path / "capture"
    result = CliRunner().invoke(
        main,
        [
            "capture",
            "--target",
            str(target),
            "--data",
            str(data),
            str(out),
            "--samples",
            "2",
            "--seq-len",
            "32",
            *TRANSFORMERS_CAPTURE,
        ],
    )
    assert result.exit_code == 0, result.output
    info = json.loads((out / "capture.json").read_text())
    assert info["sequences"] == 2 and info["tokens"] == 64
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    ids = load_file(str(out / "hidden_states.safetensors"))["input_ids"]
    text = AutoTokenizer.from_pretrained(target).decode(ids[0]).replace(" ", "")
    assert text.startswith("<user>def")  # the fixture tokenizer has no byte-level decoder


def test_chat_messages_without_a_template(pair: dict[str, Path], tmp_path: Path) -> None:
    data = tmp_path / "chat.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    code, output = run_cli_checked(
        [
            "capture",
            "--target",
            str(pair["target"]),
            "--data",
            str(data),
            str(tmp_path / "capture"),
            *TRANSFORMERS_CAPTURE,
        ]
    )
    assert_clean_failure(code, output, "need a tokenizer chat template")


def test_draft_without_embeddings_needs_them_from_the_capture(
    pair: dict[str, Path], no_embed_draft: Path, tmp_path: Path
) -> None:
    draft = no_embed_draft
    capture = tmp_path / "capture"
    args = ["capture", "--target", str(pair["target"]), "--data", str(pair["data"]), str(capture)]
    result = CliRunner().invoke(
        main, [*args, "--samples", "4", "--seq-len", "32", *TRANSFORMERS_CAPTURE]
    )
    assert result.exit_code == 0, result.output
    code, output = run_cli_checked(
        ["export", str(draft), str(tmp_path / "o"), "--calib-hidden-states", str(capture)]
    )
    assert_clean_failure(code, output, "re-run `eaglequant capture` with --embeddings")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has an accelerator")
def test_device_cuda_without_an_accelerator(tiny_draft: Path, tmp_path: Path) -> None:
    code, output = run_cli_checked(
        ["export", str(tiny_draft), str(tmp_path / "o"), "--calib", "none", "--device", "cuda"]
    )
    assert_clean_failure(
        code, output, "device 'cuda': torch sees no CUDA or ROCm device here; use device cpu"
    )
