"""The CPU plugin's FP8 GEMM: vLLM's own CPU GEMM over the FP8 values, the scales after.

Run in a child (it loads vLLM's kernel library, which the test process never does): the
float32 GEMM against the FP8 values dequantized and multiplied in float64; the BF16 GEMM
against the float32 one rounded to BF16 once; the static-input path against vLLM's own
quantization followed by the same GEMM (float32 inputs: equal; BF16 inputs, through the GEMM
with the scales folded in: within one BF16 step, rarely apart).
"""

from __future__ import annotations

import json
import os
import textwrap

from tests.conftest import PYTHON, run_child

SCRIPT = textwrap.dedent(
    """
    import json, os, torch
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.platforms import current_platform
    current_platform.import_kernels()
    from vllm.model_executor.layers.quantization.input_quant_fp8 import QuantFP8
    from vllm.model_executor.layers.quantization.utils.quant_utils import GroupShape
    from eaglequant.engine import cpu_fp8_gemm as gemm

    def kernel():
        return type("Kernel", (), {})()

    generator = torch.Generator().manual_seed(0)
    rows, cols, outs = 5, 96, 40
    a = (torch.randn(rows + 3, cols, generator=generator) * 50).clamp(-448, 448)
    a = a.to(torch.float8_e4m3fn)
    w = (torch.randn(outs, cols, generator=generator) * 50).to(torch.float8_e4m3fn)
    bias = torch.randn(outs, generator=generator)
    report = {"float32": [], "bfloat16_once": None, "static": None}
    os.environ[gemm.GEMM_ENV] = "float32"
    for a_scale, w_scale in (
        (torch.tensor(0.01), torch.tensor(0.02)),
        (torch.rand(rows + 3, 1, generator=generator), torch.rand(outs, 1, generator=generator)),
    ):
        got = gemm.plain_scaled_mm(
            kernel(), A=a, B=w.t(), out_dtype=torch.float32, As=a_scale, Bs=w_scale,
            bias=bias, output_shape=[rows, outs],
        )
        sa = a_scale.double().reshape(-1, 1)[:rows] if a_scale.numel() > 1 else a_scale.double()
        sw = w_scale.double().reshape(-1, 1) if w_scale.numel() > 1 else w_scale.double()
        expected = (a[:rows].double() * sa) @ (w.double() * sw).t() + bias.double()
        error = (got.double() - expected).abs().max() / expected.abs().max()
        report["float32"].append(float(error))
    # small integers: every sum is exact in float32 whatever the order, so only rounding shows
    ia = torch.randint(-15, 16, (9, 128), generator=generator).float().to(torch.float8_e4m3fn)
    iw = torch.randint(-15, 16, (64, 128), generator=generator).float().to(torch.float8_e4m3fn)
    half = torch.tensor(0.5)
    results = {}
    for dtype in ("float32", "bfloat16"):
        os.environ[gemm.GEMM_ENV] = dtype
        results[dtype] = gemm.plain_scaled_mm(
            kernel(), A=ia, B=iw.t(), out_dtype=torch.float32, As=half, Bs=half, bias=None,
            output_shape=[9, 64],
        )
    report["bfloat16_once"] = torch.equal(
        results["bfloat16"], results["float32"].bfloat16().float()
    )
    # the static-input path quantizes exactly as vLLM's QuantFP8 does, then the same GEMM
    os.environ[gemm.GEMM_ENV] = "float32"
    x = torch.randn(7, 96, generator=generator, dtype=torch.float32) * 3
    x_scale, w_scale = torch.tensor([0.013]), torch.tensor([0.02])
    layer = torch.nn.Module()
    layer.weight, layer.weight_scale, layer.input_scale = w.t(), w_scale, x_scale
    stub = kernel()
    stub._get_layer_params = lambda m: (m.weight, m.weight_scale, m.input_scale, None)
    before = x.clone()
    got = gemm._static_input_linear(stub, layer, x, None)
    report["input_unchanged"] = torch.equal(x, before)
    with set_current_vllm_config(VllmConfig()):  # a CustomOp reads it when built
        quant = QuantFP8(static=True, group_shape=GroupShape.PER_TENSOR)
    quantized, _ = quant.forward_native(x, x_scale)
    reference = gemm.plain_scaled_mm(
        kernel(), A=quantized, B=w.t(), out_dtype=torch.float32, As=x_scale, Bs=w_scale,
        bias=None, output_shape=[7, outs],
    )
    report["static"] = float((got - reference).abs().max())
    # a BF16 input goes through the 16-bit table: the same values as vLLM's arithmetic
    xb = (torch.randn(7, 96, generator=generator) * 8).to(torch.bfloat16)
    xb[0, :4] = torch.tensor([1e4, -1e4, 1e-30, -0.0])  # clamped, subnormal-flushed, signed zero
    stub_b = kernel()
    stub_b._get_layer_params = stub._get_layer_params
    before = xb.clone()
    got_b = gemm._static_input_linear(stub_b, layer, xb, None)
    report["input_unchanged_bf16"] = torch.equal(xb, before)
    quantized_b, _ = quant.forward_native(xb, x_scale)
    reference_b = gemm.plain_scaled_mm(
        kernel(), A=quantized_b, B=w.t(), out_dtype=torch.bfloat16, As=x_scale, Bs=w_scale,
        bias=None, output_shape=[7, outs],
    )
    # it goes through the GEMM with the scales folded in: each product rounded once in
    # float32, so an output may sit one BF16 step from the scales-after path, rarely
    state_b = gemm._static_state(stub_b, layer)
    report["scaled_gemm"] = state_b.scaled_into is not None
    differ = got_b != reference_b
    _, exponent = torch.frexp(reference_b.double())
    step = torch.ldexp(torch.ones_like(reference_b.double()), exponent - 8)
    report["static_bf16_within_a_step"] = bool(
        ((got_b.double() - reference_b.double()).abs() <= step).all()
    )
    report["static_bf16_differ"] = float(differ.float().mean())
    # the same on a draft-sized problem, against float64
    big_w = (torch.randn(1536, 256, generator=generator) * 50).to(torch.float8_e4m3fn)
    big = torch.nn.Module()
    big.weight, big.weight_scale, big.input_scale = big_w.t(), w_scale, x_scale
    stub_c = kernel()
    stub_c._get_layer_params = stub._get_layer_params
    xc = (torch.randn(64, 256, generator=generator) * 3).bfloat16()
    got_c = gemm._static_input_linear(stub_c, big, xc, None)
    values_c = quant.forward_native(xc, x_scale)[0].double()
    exact_c = (values_c @ big_w.double().t()) * (x_scale.double() * w_scale.double())
    report["draft_sized_differ"] = float((got_c != exact_c.bfloat16()).float().mean())
    # a GEMM that does not write what the check expects is not used
    from vllm import _custom_ops as ops
    create = ops.create_onednn_mm
    ops.create_onednn_mm = lambda weight, size: create(weight * 1.02, size)
    gemm._scaled_gemm_holds.cache_clear()
    report["mutant_refused"] = gemm._scaled_gemm_holds() is False
    ops.create_onednn_mm = create
    gemm._scaled_gemm_holds.cache_clear()
    # the table against vLLM's arithmetic on every one of the 65,536 BF16 and float16 inputs
    state = gemm._static_state(stub_b, layer)
    table_equal = []
    for dtype in (torch.bfloat16, torch.float16):
        every = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(dtype).reshape(256, 256)
        looked_up = state.quantize(every)
        vllm_values = quant.forward_native(every, x_scale)[0].float()
        table_equal.append(torch.equal(looked_up.nan_to_num(), vllm_values.nan_to_num()))
    report["table_equal"] = table_equal
    from vllm.model_executor.kernels.linear.scaled_mm import pytorch
    kernel_class = pytorch.ChannelWiseTorchFP8ScaledMMLinearKernel
    gemm.plain_fp8_gemm()
    patched = kernel_class.apply_weights
    gemm.plain_fp8_gemm()  # vLLM may load its plugins more than once in a process
    report["idempotent"] = kernel_class.apply_weights is patched
    print(json.dumps(report))
    """
)


def test_the_cpu_fp8_gemm_is_the_fp8_arithmetic() -> None:
    env = {k: v for k, v in os.environ.items() if k != "EAGLEQUANT_CPU_FP8_GEMM"}
    report = json.loads(run_child([PYTHON, "-c", SCRIPT], env=env).strip().splitlines()[-1])
    assert max(report["float32"]) < 1e-6  # float32 rounding of exact products: summation order
    assert report["bfloat16_once"] is True
    assert report["static"] == 0.0  # the same quantized values and the same GEMM
    assert report["input_unchanged"] is True  # a float32 input is not quantized in place
    # the table path: vLLM's values, then the GEMM with the scales folded in
    assert report["scaled_gemm"] is True  # the installed vLLM's oneDNN GEMM passes the check
    assert report["static_bf16_within_a_step"] is True
    assert report["static_bf16_differ"] <= 0.01
    assert report["draft_sized_differ"] <= 1e-3  # measured 2e-4: float32 rounding, not more
    assert report["mutant_refused"] is True  # a GEMM 2% off fails the once-a-process check
    assert report["input_unchanged_bf16"] is True
    assert report["table_equal"] == [True, True]  # every 16-bit input, NaNs included
    assert report["idempotent"] is True


NATIVE = textwrap.dedent(
    """
    import json, os, torch
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.platforms import current_platform
    current_platform.import_kernels()
    from vllm.model_executor.layers.quantization.input_quant_fp8 import QuantFP8
    from vllm.model_executor.layers.quantization.utils.quant_utils import GroupShape
    from eaglequant.engine import cpu_fp8_gemm as gemm, cpu_fp8_native as native

    with set_current_vllm_config(VllmConfig()):  # a CustomOp reads it when built
        quant = QuantFP8(static=True, group_shape=GroupShape.PER_TENSOR)
    generator = torch.Generator().manual_seed(0)
    weight = (torch.randn(1536, 256, generator=generator) * 50).to(torch.float8_e4m3fn)
    x = (torch.randn(2, 32, 256, generator=generator) * 3).bfloat16()  # 3-D, as vLLM passes
    x_scale = torch.tensor([0.013])
    scales = {"tensor": torch.tensor([0.02]),
              "channel": torch.rand(1536, 1, generator=generator) / 40 + 1e-3}

    def run(scale_name):
        layer = torch.nn.Module()
        layer.weight, layer.weight_scale = weight.t(), scales[scale_name]
        layer.input_scale = x_scale
        kernel = type("Kernel", (), {})()
        kernel._get_layer_params = lambda m: (m.weight, m.weight_scale, m.input_scale, None)
        out = gemm._static_input_linear(kernel, layer, x, None)
        return out, gemm._static_state(kernel, layer)

    values = quant.forward_native(x.reshape(-1, 256), x_scale)[0].double()
    report = {"has_bf16": torch.cpu._is_avx512_bf16_supported()}
    before = x.clone()
    outputs = {}
    for mode in ("auto", "float32"):
        os.environ[gemm.GEMM_ENV] = mode
        for name, w_scale in scales.items():
            out, state = run(name)
            outputs[mode, name] = out
            both = x_scale.double() * w_scale.double().reshape(1, -1)
            exact = (values @ weight.double().t()) * both
            report[f"{mode}_{name}"] = {
                "native": state.native is not None,
                "folded": state.scaled_into is not None,
                "shape": list(out.shape),
                "differ": float((out.reshape(-1, 1536) != exact.bfloat16()).float().mean()),
            }
    report["input_unchanged"] = torch.equal(x, before)
    report["native_vs_folded_differ"] = max(
        float((outputs["auto", n] != outputs["float32", n]).float().mean()) for n in scales)
    # as on a CPU without AVX512-BF16: auto keeps vLLM's GEMM, native says why not
    native._loaded.cache_clear()
    torch.cpu._is_avx512_bf16_supported = lambda: False
    os.environ[gemm.GEMM_ENV] = "auto"
    _, state = run("tensor")
    report["without_bf16"] = {
        "native": state.native is not None, "folded": state.scaled_into is not None
    }
    os.environ[gemm.GEMM_ENV] = "native"
    try:
        run("tensor")
        report["native_refused"] = None
    except ValueError as error:
        report["native_refused"] = str(error)
    print(json.dumps(report))
    """
)


def test_the_compiled_kernel_runs_the_static_path_where_the_cpu_has_bf16() -> None:
    """``auto`` takes eaglequant's compiled kernel on an AVX512-BF16 CPU (vLLM's oneDNN GEMM
    with the scales folded in elsewhere), and both give the FP8 arithmetic: against vLLM's own
    quantization multiplied in float64, only float32 summation separates them."""
    env = {k: v for k, v in os.environ.items() if k != "EAGLEQUANT_CPU_FP8_GEMM"}
    report = json.loads(run_child([PYTHON, "-c", NATIVE], env=env).strip().splitlines()[-1])
    for scale in ("tensor", "channel"):
        auto, float32 = report[f"auto_{scale}"], report[f"float32_{scale}"]
        assert auto["native"] is report["has_bf16"] and auto["folded"] is not report["has_bf16"]
        assert float32 == {**float32, "native": False, "folded": True}
        assert auto["shape"] == float32["shape"] == [2, 32, 1536]
        assert auto["differ"] <= 1e-3 and float32["differ"] <= 1e-3  # measured: 0 to 3e-4
    assert report["native_vs_folded_differ"] <= 1e-3
    assert report["input_unchanged"] is True
    assert report["without_bf16"] == {"native": False, "folded": True}
    assert report["native_refused"] == (
        "EAGLEQUANT_CPU_FP8_GEMM=native: this CPU has no AVX512-BF16 (VDPBF16PS)"
    )
