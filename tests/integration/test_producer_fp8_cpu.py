"""The CPU engine's arithmetic for other producers' FP8 layers, against plain torch.

One linear per format is built in a child (it loads vLLM's kernel library) the way vLLM
builds a draft linear: the quantization config class for the draft's ``quant_method`` parses
the config, a ``ReplicatedLinear`` takes its linear method, the checkpoint's tensors go in
through the parameters' own weight loaders, ``process_weights_after_loading`` runs, and the
layer is called with eaglequant's CPU plugin loaded and the environment eaglequant gives its
CPU engines (vLLM's W8A16 AMX FP8 kernels switched off), as in an engine. Each output is held to
a plain-torch reference of the format, computed in float64 from the tensors as stored and
rounded to BF16 once: W8A8 (inputs quantized to FP8 as the format says: per token, per
tensor, per 128-wide group), W8A16 (BF16 inputs, FP8 weights), or W8A16 with the dequantized
weight rounded to BF16 first, whichever the kernel vLLM chose on this CPU computes
(``ARITHMETIC``). The references differ on every format here, so a kernel that computed
another one fails.

Measured with vLLM 0.32 on an AMX CPU: llm-compressor's per-channel/per-token layer and
``fp8``'s per-tensor layers run W8A8 through eaglequant's plain GEMM, each equal to its
reference (``fp8`` with dynamic inputs quantizes them per token, as vLLM picks wherever CUTLASS
FP8 is supported, an H100 among them; ROCm quantizes them per tensor); the block layers (both
methods) run on eaglequant's CPU block kernel, their inputs quantized per 128-wide group as a
GPU quantizes them (vLLM's own CPU block kernel, W8A16 on AMX tiles, would keep them BF16),
equal to the W8A8 reference; as AVX2 too, where vLLM has no CPU block kernel.

- ``ct-fp8-dynamic``: llm-compressor's per-channel weights (BF16 scales, as stored) with
  dynamic per-token inputs, from the committed fixture's config and ``o_proj`` tensors.
- ``ct-fp8-block``: its 128x128 weight blocks with per-group dynamic inputs.
- ``fp8`` (vLLM's own method): per-tensor weights with static and with dynamic per-tensor
  inputs, and ``weight_block_size`` blocks (``weight_scale_inv``), from the same values.
"""

from __future__ import annotations

import json
import os
import textwrap

from eaglequant.engine.config import platform_env
from tests.conftest import PYTHON, REPO, TOY, run_child

FIXTURES = REPO / "tests" / "producers" / "toy"

SCRIPT = textwrap.dedent(
    """
    import json, sys, torch
    from safetensors.torch import load_file
    from vllm.config import ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.plugins import load_general_plugins
    from vllm.model_executor.layers.linear import ReplicatedLinear
    from vllm.model_executor.layers.quantization import get_quantization_config
    from vllm.utils.torch_utils import set_default_torch_dtype

    load_general_plugins()  # eaglequant's CPU plugin, as every engine process loads it
    target, fixtures = sys.argv[1], sys.argv[2]
    with set_current_vllm_config(VllmConfig()):  # one rank: vLLM's parameters read its group
        import socket
        from vllm.distributed import init_distributed_environment, initialize_model_parallel
        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            port = free.getsockname()[1]
        init_distributed_environment(1, 0, f"tcp://127.0.0.1:{port}", 0, backend="gloo")
        initialize_model_parallel(1, 1)
    NAME = "midlayer.self_attn.o_proj"
    PREFIX = "model.layers.2.self_attn.o_proj"
    FP8_MAX = 448.0
    MIN_SCALE = 1.0 / (FP8_MAX * 512.0)
    generator = torch.Generator().manual_seed(0)
    x = (torch.randn(7, 256, generator=generator) * 3).bfloat16()
    x[0, :3] = torch.tensor([40.0, -25.0, 1e-3])  # an outlier sets row 0's and group 0's range

    def fp8(values, scale):
        return (values / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).double() * scale

    def token_scales(values):
        return (values.abs().amax(-1, keepdim=True) / FP8_MAX).clamp(min=MIN_SCALE)

    def inputs(kind):
        \"\"\"The inputs as the format quantizes them, float64 (the scales in float32).\"\"\"
        xf = x.float()
        if kind == "token":
            return fp8(xf, token_scales(xf)).double()
        if kind == "tensor":
            return fp8(xf, (xf.abs().amax() / FP8_MAX).clamp(min=MIN_SCALE)).double()
        if kind == "group":
            groups = xf.reshape(7, -1, 128)
            return fp8(groups, token_scales(groups)).reshape(7, 256).double()
        if kind == "static":
            return fp8(xf, STATIC).double()
        raise ValueError(kind)

    def dequantized(weight, scale):
        \"\"\"The FP8 weight times its scale as stored (per tensor, channel or 2-D block).\"\"\"
        w, s = weight.double(), scale.double()
        if s.dim() == 2 and s.shape[1] > 1:  # blocks
            rows, cols = -(-w.shape[0] // s.shape[0]), -(-w.shape[1] // s.shape[1])
            s = s.repeat_interleave(rows, 0)[: w.shape[0]].repeat_interleave(cols, 1)
            return w * s[:, : w.shape[1]]
        return w * s.reshape(-1, 1) if s.numel() > 1 else w * s

    def kernel_of(layer):  # the linear kernel vLLM chose (its method's or its scheme's)
        for holder in (layer.quant_method, getattr(layer, "scheme", None)):
            for value in vars(holder or object()).values():
                if "Kernel" in type(value).__name__:
                    return type(value).__name__
        return type(layer.quant_method).__name__

    def run(method, qcfg, tensors, activation):
        try:
            return built(method, qcfg, tensors, activation)
        except ValueError as exc:  # vLLM's own refusal: no CPU kernel for the format here
            return {"refused": str(exc).splitlines()[0]}

    def built(method, qcfg, tensors, activation):
        model = ModelConfig(model=target, dtype="bfloat16")
        with set_current_vllm_config(VllmConfig(model_config=model)), set_default_torch_dtype(
            torch.bfloat16
        ):
            config = get_quantization_config(method).from_config(qcfg)
            layer = ReplicatedLinear(
                256, 256, bias=False, params_dtype=torch.bfloat16, quant_config=config,
                prefix=PREFIX, disable_tp=True,
            )
            for name, param in layer.named_parameters():
                param.weight_loader(param, tensors[name])
            layer.quant_method.process_weights_after_loading(layer)
            before = x.clone()
            got = layer(x)[0]
            assert torch.equal(x, before)
        scale = tensors.get("weight_scale", tensors.get("weight_scale_inv"))
        weight = dequantized(tensors["weight"], scale)
        references = {
            "w8a8": (inputs(activation) @ weight.t()).bfloat16(),
            "w8a16": (x.double() @ weight.t()).bfloat16(),
            "w8a16_bf16_weight": (x.double() @ weight.bfloat16().double().t()).bfloat16(),
        }
        out = {"kernel": kernel_of(layer), "dtype": str(got.dtype)}
        for key, ref in references.items():
            _, exponent = torch.frexp(ref.double())
            step = torch.ldexp(torch.ones_like(ref.double()), exponent - 8)
            apart = (got.double() - ref.double()).abs()
            out[key] = {
                "within_a_step": bool((apart <= step).all()),
                "differ": float((got != ref).float().mean()),
            }
        return out

    def stored(fixture):
        tensors = load_file(f"{fixtures}/{fixture}/model.safetensors")
        qcfg = json.load(open(f"{fixtures}/{fixture}/config.json"))["quantization_config"]
        return qcfg, {k[len(NAME) + 1:]: v for k, v in tensors.items() if k.startswith(NAME + ".")}

    report = {}
    qcfg, tensors = stored("ct-fp8-dynamic")
    report["ct-channel-token"] = run("compressed-tensors", qcfg, tensors, "token")
    qcfg, tensors = stored("ct-fp8-block")
    report["ct-block"] = run("compressed-tensors", qcfg, tensors, "group")
    # vLLM's own fp8 checkpoints: one per-tensor scale (the channels' largest), as stored
    _, channel = stored("ct-fp8-dynamic")
    w_scale = channel["weight_scale"].float().max().reshape(1)
    weight = (channel["weight"].double() * channel["weight_scale"].double() / w_scale.double())
    per_tensor = {"weight": weight.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn),
                  "weight_scale": w_scale}
    STATIC = torch.tensor([0.05])  # clips row 0's outlier: the static path's clamp shows
    for scheme in ("static", "dynamic"):
        qcfg = {"quant_method": "fp8", "activation_scheme": scheme}
        tensors = dict(per_tensor)
        if scheme == "static":
            tensors["input_scale"] = STATIC
        # dynamic: per token, as vLLM's Fp8LinearMethod picks where CUTLASS FP8 is supported
        inputs_as = "static" if scheme == "static" else "token"
        report[f"fp8-{scheme}"] = run("fp8", qcfg, tensors, inputs_as)
    _, block = stored("ct-fp8-block")
    qcfg = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    tensors = {"weight": block["weight"], "weight_scale_inv": block["weight_scale"].float()}
    report["fp8-block"] = run("fp8", qcfg, tensors, "group")
    report["amx"] = torch.cpu._is_amx_tile_supported()
    print(json.dumps(report))
    """
)


# The arithmetic each CPU kernel vLLM 0.32 may choose computes: eaglequant's plain GEMM behind
# vLLM's torch kernels quantizes the inputs (W8A8); vLLM's AMX kernels keep them BF16 and round
# the dequantized weight to BF16 once (W8A16).
ARITHMETIC = {
    "CPUFP8W8A8ScaledMMLinearKernel": "w8a8",  # CPUs with AMX-FP8
    "ChannelWiseTorchFP8ScaledMMLinearKernel": "w8a8",
    "PerTensorTorchFP8ScaledMMLinearKernel": "w8a8",
    "CPUFp8PerTensorScaledMMLinearKernel": "w8a16_bf16_weight",
    "CPUFp8BlockScaledMMKernel": "w8a16_bf16_weight",
    "CpuFp8BlockW8A8Kernel": "w8a8",  # eaglequant's, before it
}


def test_other_producers_fp8_layers_on_the_cpu_are_one_plain_arithmetic() -> None:
    env = os.environ | platform_env(os.environ, on_cpu=True, workers=1, cores=[])
    lines = run_child([PYTHON, "-c", SCRIPT, str(TOY / "target"), str(FIXTURES)], env=env)
    report = json.loads(lines.strip().splitlines()[-1])
    print(json.dumps(report, indent=1))
    report.pop("amx")
    assert set(report) == {"ct-channel-token", "ct-block", "fp8-static", "fp8-dynamic", "fp8-block"}
    # llm-compressor's FP8_DYNAMIC runs as the format says: per-token FP8 inputs, one rounding
    assert report["ct-channel-token"]["kernel"] == "ChannelWiseTorchFP8ScaledMMLinearKernel"
    # every format quantizes its inputs in the engines, as on a GPU (never W8A16)
    for case in report:
        assert ARITHMETIC[report[case]["kernel"]] == "w8a8", (case, report[case])
    for case, outcome in report.items():
        assert "refused" not in outcome, (case, outcome)
        assert outcome["dtype"] == "torch.bfloat16", (case, outcome)
        expected = ARITHMETIC[outcome["kernel"]]
        assert outcome[expected]["within_a_step"] and outcome[expected]["differ"] <= 0.01, (
            case,
            outcome,
        )  # measured: 0.0, the same BF16 values
        others = [key for key in ("w8a8", "w8a16", "w8a16_bf16_weight") if key != expected]
        assert not any(outcome[key]["within_a_step"] for key in others), (case, outcome)
