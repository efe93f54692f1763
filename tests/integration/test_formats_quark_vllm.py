"""OCP MX, W4A8 and per-channel static exports with real Quark on the tiny pair: inspect's
prediction against vLLM's own scheme dispatch, check 6 on MX scales (and a corrupted one),
MXFP8 weights against Quark's own fake quantization, the CPU plugin's MX kernels."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import get_args

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from eaglequant.cli import main
from eaglequant.rules.draft import MIDLAYER_LINEARS
from eaglequant.rules.inspection import inspect_checkpoint
from eaglequant.rules.speculative import DRAFT_KV_CACHE_DTYPES
from tests.conftest import PYTHON, run_child
from tests.support import check6

VLLM_SCHEME = """
import json, sys
from vllm.model_executor.layers.quantization.quark.quark import QuarkConfig
qcfg = json.load(open(sys.argv[1] + "/config.json"))["quantization_config"]
_, _, scheme = QuarkConfig.from_config(qcfg)._get_scheme_cls_from_config(
    qcfg["global_quant_config"]
)
print(scheme.__name__)
"""
MX_ON_CPU = """
import sys, torch
from safetensors.torch import load_file
from vllm.model_executor.kernels.linear import init_mxfp4_linear_kernel, init_mxfp8_linear_kernel
from vllm.model_executor.layers.quantization.utils.mxfp8_utils import _mxfp8_e4m3_quantize_torch
from vllm.model_executor.layers.quantization.utils.quant_utils import kMxfp4Dynamic
for init in (lambda: init_mxfp4_linear_kernel(kMxfp4Dynamic),
             lambda: init_mxfp8_linear_kernel(weight_shape=(64, 128))):
    try:
        init()
    except ValueError as exc:
        print("without:", str(exc).splitlines()[0])
from eaglequant.engine.cpu_fp8_plugin import list_mxfp4_emulation_on_cpu, list_mxfp8_on_cpu
list_mxfp4_emulation_on_cpu()
list_mxfp8_on_cpu()
print("with:", type(init_mxfp4_linear_kernel(kMxfp4Dynamic)).__name__)
kernel = init_mxfp8_linear_kernel(weight_shape=(64, 128))
print("with:", type(kernel).__name__)
tensors = load_file(sys.argv[1] + "/model.safetensors")
layer = torch.nn.Module()
layer.weight = torch.nn.Parameter(tensors["midlayer.self_attn.q_proj.weight"], requires_grad=False)
layer.weight_scale = torch.nn.Parameter(
    tensors["midlayer.self_attn.q_proj.weight_scale"], requires_grad=False
)
kernel.process_weights_after_loading(layer)
def dq(values, exponents):
    scales = torch.exp2(exponents.double() - 127).repeat_interleave(32, -1)
    return values.double() * scales
x = torch.randn(5, 128, dtype=torch.bfloat16) * 3
got = kernel.apply_weights(layer, x).double()
weight = dq(layer.weight, layer.weight_scale)
native = torch.nn.functional.linear(dq(*_mxfp8_e4m3_quantize_torch(x)), weight)
unquantized = torch.nn.functional.linear(x.double(), weight)
print("dtypes:", layer.weight.dtype, layer.weight_scale.dtype, got.dtype)
print("native:", (got - native).abs().max().item() <= 1e-2 * native.abs().max().item())
print("inputs rounded:", not torch.allclose(got, unquantized.to(torch.bfloat16).double()))
"""
CHANNELWISE = """
import torch
from vllm.model_executor.kernels.linear.scaled_mm.pytorch import (
    ChannelWiseTorchFP8ScaledMMLinearKernel as Kernel,
)
from eaglequant.engine.cpu_fp8_plugin import per_tensor_inputs_in_channelwise_mm
g = torch.Generator().manual_seed(0)
A = torch.randn(5, 64, generator=g).to(torch.float8_e4m3fn)
W = torch.randn(32, 64, generator=g).to(torch.float8_e4m3fn)
Bs = torch.rand(32, 1, generator=g) + 0.1
args = dict(A=A, B=W.t(), out_dtype=torch.float32, As=torch.tensor(0.5), Bs=Bs, bias=None,
            output_shape=[5, 32])
try:
    Kernel.apply_scaled_mm(None, **args)
except RuntimeError as exc:
    print("without:", exc)
per_tensor_inputs_in_channelwise_mm()
per_tensor_inputs_in_channelwise_mm()
expected = (A.float() @ W.float().t()) * 0.5 * Bs.t()
print("with:", torch.allclose(Kernel.apply_scaled_mm(None, **args), expected, rtol=1e-5))
"""
MX_DTYPE = {"mxfp4": "mxfp4", "mxfp8": "mxfp8_e4m3"}  # each recipe's, as check 6 names it
RECIPES = {  # recipe -> the Quark scheme vLLM builds its layers with
    "mxfp8": "QuarkOCP_MX",
    "mxfp4": "QuarkOCP_MX",
    "mxfp4-fp8": "QuarkW4A8_MXFP4_FP8",
    "fp8-static-channel": "QuarkW8A8Fp8",
}


@pytest.fixture(scope="module")
def exports(pair: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny draft exported with each recipe (fixed input range: no calibration run)."""
    root = tmp_path_factory.mktemp("formats")
    out = {}
    for recipe in RECIPES:
        out[recipe] = root / recipe
        args = ["export", str(pair["draft"]), str(out[recipe]), "--recipe", recipe]
        result = CliRunner().invoke(main, [*args, "--calib", "none"], catch_exceptions=False)
        assert result.exit_code == 0, result.output
    return out


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_inspect_predicts_vllms_scheme(recipe: str, exports: dict[str, Path]) -> None:
    report = inspect_checkpoint(exports[recipe])
    assert report.problems == []
    quantized = [f for f in report.fates if f.quantized]
    assert quantized and {f.vllm_scheme for f in quantized} == {RECIPES[recipe]}
    assert (
        run_child([PYTHON, "-c", VLLM_SCHEME, str(exports[recipe])]).split()[-1]
        == (RECIPES[recipe])
    )
    assert report.size is not None and 0 < report.size.quantized_fraction < 1


@pytest.mark.parametrize("recipe", ["mxfp4", "mxfp8"])
def test_mx_scales_pass_check6_and_a_corrupted_one_fails(
    recipe: str, pair: dict[str, Path], exports: dict[str, Path], tmp_path: Path
) -> None:
    def problems(draft: Path) -> list[str]:
        return check6(pair, draft)[0]

    good = exports[recipe]
    assert problems(good) == []
    last, mx_dtype = MIDLAYER_LINEARS[-1], MX_DTYPE[recipe]
    for name, corrupt, expected in [
        ("scaled", lambda e: e.add_(6), f"{last}.weight ({mx_dtype} scales): relative error "),
        ("nan", lambda e: e.fill_(255), f"{last}.weight_scale holds the E8M0 NaN exponent 255"),
    ]:
        bad = shutil.copytree(good, tmp_path / name)
        tensors = load_file(str(bad / "model.safetensors"))
        exponents = tensors[f"{last}.weight_scale"]
        assert exponents.dtype == torch.uint8
        corrupt(exponents[:1, :1])
        save_file(tensors, str(bad / "model.safetensors"), metadata={"format": "pt"})
        found = problems(bad)
        assert len(found) == 1 and found[0].startswith(expected), found


def test_draft_kv_cache_dtypes_are_vllms() -> None:
    from vllm.config.cache import CacheDType
    from vllm.config.speculative import SpeculativeConfig

    assert set(DRAFT_KV_CACHE_DTYPES) <= set(get_args(CacheDType))
    assert "kv_cache_dtype" in SpeculativeConfig.__dataclass_fields__


def test_fix_config_repairs_a_bare_exclude_on_an_mx_export(
    exports: dict[str, Path], tmp_path: Path
) -> None:
    from eaglequant.rules.fix_config import fix_config

    broken = shutil.copytree(exports["mxfp4"], tmp_path / "bare")
    config = json.loads((broken / "config.json").read_text())
    config["quantization_config"]["exclude"] = ["fc", "lm_head"]
    (broken / "config.json").write_text(json.dumps(config))
    problems = [str(p) for p in inspect_checkpoint(broken).problems]
    assert any(
        p.startswith("model.fc: vLLM would build it as mxfp4 a:mxfp4 dynamic but 'fc.weight' is")
        for p in problems
    ), problems
    assert fix_config(broken).changed
    assert inspect_checkpoint(broken).problems == []


def test_mxfp8_weights_are_quarks_own_fake_quantization(
    pair: dict[str, Path], exports: dict[str, Path]
) -> None:
    """Quark's export writes MXFP8 through ``export_per_group_fp8``: dequantized, each weight
    is what Quark's per-group FP8 fake quantization makes of the BF16 weight with those scales."""
    from quark.torch.kernel.hw_emulation.hw_emulation_interface import (
        fake_quantize_fp8_per_group_with_scale,
    )

    bf16 = load_file(str(pair["draft"] / "model.safetensors"))
    fp8 = load_file(str(exports["mxfp8"] / "model.safetensors"))
    for name in MIDLAYER_LINEARS:
        values, exponents = fp8[f"{name}.weight"], fp8[f"{name}.weight_scale"]
        assert values.dtype == torch.float8_e4m3fn and exponents.dtype == torch.uint8
        assert exponents.shape == (values.shape[0], values.shape[1] // 32)
        scales = torch.exp2(exponents.float() - 127)
        ours = values.float() * scales.repeat_interleave(32, -1)
        quarks = fake_quantize_fp8_per_group_with_scale(
            bf16[f"{name}.weight"].float(), scales, -1, 32, fp8_dtype=torch.float8_e4m3fn
        )
        assert torch.equal(ours, quarks), name
        assert (values.float().abs().amax(-1) > 224).all(), name  # each row's top block used


def test_the_cpu_plugin_lets_channelwise_fp8_take_a_static_input_scale() -> None:
    """fp8-static-channel's layers (static per-tensor inputs, per-channel weights) reach vLLM's
    channel-wise torch GEMM on CPU, which slices the input scale per token."""
    assert run_child([PYTHON, "-c", CHANNELWISE]).splitlines()[-2:] == [
        "without: narrow() cannot be applied to a 0-dim tensor.",
        "with: True",
    ]


def test_the_cpu_plugin_gives_mx_layers_kernels(exports: dict[str, Path]) -> None:
    lines = run_child([PYTHON, "-c", MX_ON_CPU, str(exports["mxfp8"])]).splitlines()
    assert lines[-7:] == [
        "without: Failed to find a kernel that can implement the MXFP4 linear layer. Reasons: ",
        "without: Failed to find a kernel that can implement the MXFP8 linear layer. Reasons: ",
        "with: EmulationMxfp4LinearKernel",
        "with: CpuMxfp8LinearKernel",
        "dtypes: torch.float8_e4m3fn torch.uint8 torch.float64",
        "native: True",
        "inputs rounded: True",
    ]
