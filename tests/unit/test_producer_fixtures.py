"""inspect and fix-config on the drafts the real tools wrote (tests/producers/toy): each good
draft is clean, each broken one is named by the problem its manifest records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REPO, TOY, tree_digest
from tests.support import invoke

FIXTURES = REPO / "tests" / "producers" / "toy"
TARGET_LAYERS = "2"  # the toy target's layer count
# fixture -> the start of each problem inspect reports (none: clean); the clipped input scale
# is check 6's to judge, not inspect's.
EXPECTED = {
    "ct-fp8-dynamic": [],
    "ct-fp8-block": [],
    "modelopt-fp8-d2t-repaired": [],
    "modelopt-fp8-clipped-input-scale": [],
    "modelopt-fp8": ["{file}: tensor 'd2t': is BF16", "{file}: tensor 't2d': is BF16"],
    "ct-fp8-dynamic-plain-ignore": [
        "{config}: ignore entry 'fc' matches no vLLM module; vLLM would quantize model.fc",
        "model.fc: vLLM would build it as fp8 w:channel a:token dynamic but 'fc.weight' is BF16",
    ],
    "ct-fp8-dynamic-ignore-o-proj": [
        "{config}: ignore entry 'midlayer.self_attn.o_proj' matches no vLLM module",
        "model.layers.2.self_attn.o_proj: vLLM would build it as fp8 w:channel a:token dynamic",
    ],
    "modelopt-fp8-exclude-o-proj": [
        "model.layers.2.self_attn.o_proj: vLLM would build it as fp8 w:per_tensor a:per_tensor",
    ],
    "ct-fp8-dynamic-missing-weight-scale": [
        "{folder}: tensor 'midlayer.mlp.down_proj.weight_scale' is missing",
    ],
    "modelopt-fp8-missing-input-scale": [
        "{folder}: tensor 'midlayer.mlp.down_proj.input_scale' is missing",
    ],
    "ct-fp8-dynamic-zero-weight-scale": [
        "{file}: tensor 'midlayer.mlp.down_proj.weight_scale': must hold finite positive scales",
    ],
    "modelopt-fp8-zero-weight-scale": [
        "{file}: tensor 'midlayer.mlp.down_proj.weight_scale': must hold finite positive scales",
    ],
}


def test_every_fixture_has_an_expectation() -> None:
    assert sorted(p.name for p in FIXTURES.iterdir() if p.is_dir()) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_inspect_names_each_fixtures_defect(name: str) -> None:
    folder = FIXTURES / name
    code, output = invoke(["inspect", str(folder), "--json", "--target-layers", TARGET_LAYERS])
    problems = json.loads(output)["problems"]
    where = {"file": folder / "model.safetensors", "config": folder / "config.json"}
    expected = [e.format(folder=folder, **where) for e in EXPECTED[name]]
    assert code == (1 if expected else 0), problems
    assert len(problems) == len(expected), problems
    for problem, start in zip(problems, expected, strict=True):
        assert problem.startswith(start), (problem, start)


@pytest.mark.parametrize(
    "name",
    ["ct-fp8-dynamic-plain-ignore", "ct-fp8-dynamic-ignore-o-proj", "modelopt-fp8-exclude-o-proj"],
)
def test_fix_config_repairs_each_exclusion_defect(name: str, tmp_path: Path) -> None:
    before = tree_digest(FIXTURES / name)
    out = tmp_path / "fixed"
    code, output = invoke(
        ["fix-config", str(FIXTURES / name), "--output", str(out), "--target-layers", TARGET_LAYERS]
    )
    assert code == 0 and output.startswith("rewrote ignore "), output
    assert tree_digest(FIXTURES / name) == before
    code, output = invoke(["inspect", str(out), "--target-layers", TARGET_LAYERS])
    assert code == 0, output


def test_fix_config_restores_modelopts_cast_maps_from_the_toy_draft(tmp_path: Path) -> None:
    out = tmp_path / "fixed"
    args = ["fix-config", str(FIXTURES / "modelopt-fp8"), "--d2t-from", str(TOY / "draft")]
    code, output = invoke([*args, "--output", str(out)])
    assert code == 0, output
    assert output.splitlines()[-1] == f"restored d2t, t2d from {TOY / 'draft'} in {out}"
    repaired = FIXTURES / "modelopt-fp8-d2t-repaired" / "model.safetensors"
    from safetensors.torch import load_file

    mine, theirs = load_file(str(out / "model.safetensors")), load_file(str(repaired))
    assert mine["d2t"].equal(theirs["d2t"]) and mine["t2d"].equal(theirs["t2d"])
    assert invoke(["inspect", str(out), "--target-layers", TARGET_LAYERS])[0] == 0
