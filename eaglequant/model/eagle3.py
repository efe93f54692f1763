"""The EAGLE-3 draft as a torch module whose forward matches vLLM's ``llama_eagle3.py``.

A Qwen3 draft (``qwen3_eagle3.py``) is the same layer with ``q_norm``/``k_norm`` per head;
an MLA draft (``deepseek_eagle3.py``) the same layer with multi-head latent attention
(:mod:`eaglequant.model.mla_attention`).

Module names equal the checkpoint's tensor names (``midlayer.self_attn.q_proj``,
``fc``, ``lm_head``, …), so Quark's layer names, the checkpoint and this code
speak the same language. The forward runs the draft the way vLLM does:

* step 0: ``fc`` fuses the target's auxiliary hidden states (3*target_hidden)
  into one hidden vector (normed first with ``norm_before_fc``: ``input_norm``
  over all of them; with ``fc_norm``: one ``fc_norm.i`` per state); the next
  token's embedding and that vector are each normed (``input_layernorm``,
  ``hidden_norm``), concatenated (2*hidden) and fed to attention with RoPE;
  residual (the un-normed vector, or with ``norm_before_residual`` the
  ``hidden_norm`` output, as vLLM); ``post_attention_layernorm``; MLP; ``norm``;
  ``lm_head`` over the draft vocabulary (``d2t`` maps draft ids to target ids
  by offset).
* a draft of several layers (``num_hidden_layers``) runs the first layer as
  above, then plain pre-norm decoder layers (``layers.1``, …: attention over
  hidden inputs, vLLM's fused add-norm: the residual stream adds each layer's
  output), each with its own keys and values; ``norm`` follows the last.
* step k>0: the draft's own previous pre-norm output (post-norm with
  ``norm_output``) replaces ``fc``'s output, its own predicted token the
  embedding, one position further on. Each query
  attends to the step-0 keys up to its base position and to its own keys of
  earlier steps (the EAGLE-3 training-time-test mask), which equals what
  vLLM's KV cache holds when it drafts token after token.
"""

from __future__ import annotations

import math
import mmap
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig, PreTrainedModel

from eaglequant.io.model_config import DraftConfig
from eaglequant.model import compute
from eaglequant.model.mla_attention import MlaAttention
from eaglequant.model.norm import RMSNorm
from eaglequant.rules.draft import DraftDims, dims_from_config


class FileMappings(list[mmap.mmap]):
    """The file mappings behind a model's mapped weights; a deep copy shares, not copies, them."""

    def __deepcopy__(self, memo: dict[int, object]) -> FileMappings:
        return self


class UpcastLinear(nn.Module):
    """A linear layer stored in low precision (BF16) that computes in its input's dtype."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return compute.upcast_linear(x, self.weight, self.bias)


class Attention(nn.Module):
    """Self-attention; ``gemm_dtype``: its linears compute as vLLM's in it (None: as they are)."""

    def __init__(self, dims: DraftDims, first: bool) -> None:
        super().__init__()
        h, hd = dims.hidden, dims.head_dim
        self.heads, self.kv_heads, self.head_dim = dims.heads, dims.kv_heads, hd
        bias = dims.attention_bias  # vLLM's qkv_proj and o_proj carry it (attention_bias)
        inputs = 2 * h if first else h  # the first layer takes [embedding, hidden]
        self.q_proj = nn.Linear(inputs, dims.heads * hd, bias=bias)
        self.k_proj = nn.Linear(inputs, dims.kv_heads * hd, bias=bias)
        self.v_proj = nn.Linear(inputs, dims.kv_heads * hd, bias=bias)
        self.o_proj = nn.Linear(dims.heads * hd, h, bias=bias)
        self.rope_theta = dims.rope_theta
        # Qwen3: one RMSNorm over each head's query and key, before RoPE
        self.q_norm = RMSNorm(hd, dims.rms_norm_eps) if dims.qk_norm else None
        self.k_norm = RMSNorm(hd, dims.rms_norm_eps) if dims.qk_norm else None

    def project(
        self, x: torch.Tensor, positions: torch.Tensor, gemm_dtype: torch.dtype | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys, values (batch, heads, seq, head_dim) with RoPE applied."""
        b, t, _ = x.shape
        projections = self.q_proj, self.k_proj, self.v_proj
        q, k, v = (compute.module_linear(m, x, gemm_dtype) for m in projections)
        q = q.view(b, t, self.heads, self.head_dim)
        k = k.view(b, t, self.kv_heads, self.head_dim)
        v = v.view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        return self._rope(q, positions), self._rope(k, positions), v

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hd = self.head_dim
        inv_freq = 1.0 / (self.rope_theta ** (torch.arange(0, hd, 2, device=x.device).float() / hd))
        freqs = positions.float()[..., None] * inv_freq  # (b, t, hd/2)
        cos = torch.cat([freqs.cos(), freqs.cos()], -1)[:, None].to(x.dtype)
        sin = torch.cat([freqs.sin(), freqs.sin()], -1)[:, None].to(x.dtype)
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
        return x * cos + rotated * sin

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor,
        gemm_dtype: torch.dtype | None = None,
    ) -> torch.Tensor:
        repeat = self.heads // self.kv_heads
        k, v = k.repeat_interleave(repeat, 1), v.repeat_interleave(repeat, 1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        b, _, t, _ = out.shape
        return compute.module_linear(self.o_proj, out.transpose(1, 2).reshape(b, t, -1), gemm_dtype)


class MLP(nn.Module):
    """SwiGLU; ``gemm_dtype`` as :class:`Attention`'s."""

    def __init__(self, dims: DraftDims) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dims.hidden, dims.intermediate, bias=False)
        self.up_proj = nn.Linear(dims.hidden, dims.intermediate, bias=False)
        self.down_proj = nn.Linear(dims.intermediate, dims.hidden, bias=False)

    def forward(self, x: torch.Tensor, gemm_dtype: torch.dtype | None = None) -> torch.Tensor:
        gate = compute.module_linear(self.gate_proj, x, gemm_dtype)
        up = compute.module_linear(self.up_proj, x, gemm_dtype)
        return compute.module_linear(self.down_proj, F.silu(gate) * up, gemm_dtype)


class MidLayer(nn.Module):
    """One decoder layer: the first (``midlayer``, with ``hidden_norm``) or a later one."""

    def __init__(self, dims: DraftDims, first: bool = True) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(dims.hidden, dims.rms_norm_eps)
        self.hidden_norm = RMSNorm(dims.hidden, dims.rms_norm_eps) if first else None
        self.post_attention_layernorm = RMSNorm(dims.hidden, dims.rms_norm_eps)
        self.self_attn: Attention | MlaAttention = (
            Attention(dims, first)
            if dims.mla is None  # an MLA draft has one layer (forms.mla refuses more)
            else MlaAttention(dims.hidden, dims.heads, dims.mla, dims.rms_norm_eps)
        )
        self.mlp = MLP(dims)

    def attend(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        cache: tuple[list[torch.Tensor], ...],
        gemm_dtype: torch.dtype | None = None,
    ) -> torch.Tensor:
        """Attention over ``x`` whose keys and values join this layer's earlier steps'."""
        keys, values = cache
        q, k, v = self.self_attn.project(x, positions, gemm_dtype)
        keys.append(k)
        values.append(v)
        mask = _ttt_mask(len(keys), q.shape[2], q.device)
        keys_values = torch.cat(keys, 2), torch.cat(values, 2)
        return self.self_attn.attend(q, *keys_values, mask, gemm_dtype)

    def later_forward(
        self,
        stream: torch.Tensor,
        positions: torch.Tensor,
        cache: tuple[list[torch.Tensor], ...],
        gemm_dtype: torch.dtype | None = None,
    ) -> torch.Tensor:
        """A layer after the first: pre-norm attention and MLP on the residual stream."""
        stream = stream + self.attend(self.input_layernorm(stream), positions, cache, gemm_dtype)
        return stream + self.mlp(self.post_attention_layernorm(stream), gemm_dtype)


@dataclass
class StepOutput:
    """One speculative step over every base position."""

    logits: torch.Tensor | None  # (b, t, draft_vocab), float32; only with keep_logits
    top1: torch.Tensor | None  # (b, t) draft ids; None for an unscored last step
    prenorm: torch.Tensor  # (b, t, hidden): what the next step takes as its hidden state


class Eagle3Draft(PreTrainedModel):
    """The draft head; parameters named exactly like the checkpoint's tensors.

    A transformers ``PreTrainedModel`` so that Quark's ``export_safetensors``
    accepts it. ``forward`` takes one calibration batch and runs
    ``unroll_steps`` speculative steps, so Quark observes every step's inputs.
    """

    config_class = LlamaConfig
    d2t: torch.Tensor
    t2d: torch.Tensor

    def __init__(self, config: LlamaConfig, with_embeddings: bool = True) -> None:
        super().__init__(config)
        dims = dims_from_config(cast(DraftConfig, config.to_dict()))
        self.dims = dims
        self.unroll_steps = 1
        self.file_mappings = FileMappings()  # filled by the loader
        self.midlayer = MidLayer(dims)
        # layers after the first, keyed "1", "2", … so that names are layers.1.*, as stored
        self.layers = nn.ModuleDict(
            {str(i): MidLayer(dims, first=False) for i in range(1, dims.layers)}
        )
        self.fc = nn.Linear(dims.fc_in, dims.hidden, bias=False)
        eps = dims.rms_norm_eps
        self.input_norm = RMSNorm(dims.fc_in, eps) if dims.norm_before_fc else None
        self.fc_norm = (
            nn.ModuleList(RMSNorm(dims.target_hidden, eps) for _ in range(dims.num_aux))
            if dims.fc_norm
            else None
        )
        self.norm = RMSNorm(dims.hidden, dims.rms_norm_eps)
        self.lm_head = nn.Linear(dims.hidden, dims.draft_vocab, bias=False)
        self.embed_tokens = nn.Embedding(dims.vocab, dims.hidden) if with_embeddings else None
        self.register_buffer("d2t", torch.zeros(dims.draft_vocab, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(dims.vocab, dtype=torch.bool))

    def forward(self, aux_hidden: torch.Tensor, next_ids: torch.Tensor) -> torch.Tensor:
        """Calibration forward: ``unroll_steps`` steps; returns the last step's pre-norm state.

        Only what feeds the decoder layers is computed: the last step is not scored.
        Runs a few sequences at a time (:data:`compute.MICRO_BATCH_TOKENS`): the
        min/max a static scale needs does not depend on how rows are batched.
        """
        steps, prenorms = self.unroll_steps, []
        for rows in compute.micro_batches(aux_hidden.shape[0], aux_hidden.shape[1]):
            inputs = aux_hidden[rows], next_ids[rows], steps
            outputs = self.unroll(*inputs, keep_logits=False, score_last=False)
            prenorms.append(outputs[-1].prenorm)
        return torch.cat(prenorms)

    def fc_input(self, aux_hidden: torch.Tensor) -> torch.Tensor:
        """The auxiliary states as ``fc`` takes them: ``input_norm``, then ``fc_norm`` per state."""
        if self.input_norm is not None:
            aux_hidden = self.input_norm(aux_hidden)
        if self.fc_norm is not None:
            chunks = aux_hidden.chunk(len(self.fc_norm), dim=-1)
            aux_hidden = torch.cat([n(c) for n, c in zip(self.fc_norm, chunks, strict=True)], -1)
        return aux_hidden

    @property
    def gemm_dtype(self) -> torch.dtype:
        """What the linears compute in, as vLLM's: ``fc``'s dtype (BF16 as loaded for export).

        The decoder layers' weights may be held otherwise (float32 for Quark); their
        inputs and outputs are rounded to this dtype all the same.
        """
        return self.fc.weight.dtype

    def linear_weight(self, name: str) -> torch.Tensor:
        """The weight of the linear layer ``name`` (a checkpoint name such as ``fc``)."""
        weight = self.get_submodule(name).weight
        assert isinstance(weight, torch.Tensor)
        return weight

    def release_file_pages(self) -> None:
        """Hand the pages of the mapped tensors back to the page cache until next touched.

        They are unmodified copy-on-write file pages, so nothing is lost: the next
        use faults them back in from the page cache (or the disk). Used while Quark
        freezes and exports, which never touch fc, lm_head or embed_tokens.
        """
        for mapping in self.file_mappings:
            mapping.madvise(mmap.MADV_DONTNEED)

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    def unroll(
        self,
        aux_hidden: torch.Tensor,
        next_ids: torch.Tensor,
        steps: int,
        embed: nn.Module | None = None,
        forced_ids: torch.Tensor | None = None,
        keep_logits: bool = True,
        score_last: bool = True,
    ) -> list[StepOutput]:
        """Run ``steps`` speculative steps from every position, as vLLM drafts.

        ``aux_hidden`` (b, t, fc_in) are the target's auxiliary hidden states at
        positions 0..t-1 and ``next_ids`` (b, t) the tokens at positions 1..t.
        Step k's outputs at base position i predict the token at i+k+2. Later
        steps take the draft's own predicted tokens, as vLLM does, unless
        ``forced_ids`` (b, t+steps-1: the tokens at positions 1..) are given
        (training: the token a correct draft would have produced). Without
        ``keep_logits`` only each step's top-1 is kept (computed a block of
        vocabulary rows at a time: full-vocabulary logits are large); without
        ``score_last`` the last step skips ``lm_head``.

        ``fc`` and ``lm_head`` compute as vLLM does in their own dtype (BF16
        as loaded for export: BF16 inputs and outputs; :mod:`compute` picks
        BF16 or float32 GEMMs for this CPU), the decoder layers' linears likewise
        in :attr:`gemm_dtype` (``fc``'s), the embeddings are looked up in theirs;
        norms, attention and residuals are float32. Results are float32.
        """
        embed = embed if embed is not None else self.embed_tokens
        assert embed is not None, "a draft without embed_tokens needs the target's embeddings"
        b, t, _ = aux_hidden.shape
        base = torch.arange(t, device=aux_hidden.device).expand(b, t)
        hidden = compute.linear(self.fc_input(aux_hidden), self.fc.weight)
        tokens = next_ids
        caches: list[tuple[list[torch.Tensor], ...]] = [([], []) for _ in range(self.dims.layers)]
        outputs = []
        for step in range(steps):
            out = self._step(embed(tokens).float(), hidden, base + step, caches)
            if score_last or step < steps - 1:
                out = self._score(out, keep_logits)
            outputs.append(out)
            hidden = self.norm(out.prenorm) if self.dims.norm_output else out.prenorm
            if forced_ids is not None:
                tokens = forced_ids[:, step + 1 : step + 1 + t]
            elif out.top1 is not None:
                tokens = self.draft_to_target(out.top1)
        return outputs

    def _step(
        self,
        embeds: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        caches: list[tuple[list[torch.Tensor], ...]],
    ) -> StepOutput:
        layer = self.midlayer
        assert layer.hidden_norm is not None
        normed = layer.hidden_norm(hidden)
        residual = normed if self.dims.norm_before_residual else hidden
        x = torch.cat([layer.input_layernorm(embeds), normed], dim=-1)
        residual = residual + layer.attend(x, positions, caches[0], self.gemm_dtype)
        stream = residual + layer.mlp(layer.post_attention_layernorm(residual), self.gemm_dtype)
        for i in range(1, self.dims.layers):  # by number: keys may be replaced out of order
            later = self.layers[str(i)]
            assert isinstance(later, MidLayer)
            stream = later.later_forward(stream, positions, caches[i], self.gemm_dtype)
        return StepOutput(None, None, stream)

    def _score(self, out: StepOutput, keep_logits: bool) -> StepOutput:
        normed = self.norm(out.prenorm)
        if keep_logits:
            logits = compute.linear(normed, self.lm_head.weight)
            return StepOutput(logits, logits.argmax(-1), out.prenorm)
        return StepOutput(None, compute.top1(normed, self.lm_head.weight), out.prenorm)


def _ttt_mask(blocks: int, t: int, device: torch.device) -> torch.Tensor:
    """Step ``blocks-1``'s mask over [step-0 keys | step-1 keys | …]: causal, then diagonal."""
    causal = torch.ones(t, t, dtype=torch.bool, device=device).tril()
    eye = torch.eye(t, dtype=torch.bool, device=device)
    return torch.cat([causal] + [eye] * (blocks - 1), dim=1)


def scaled_init_(module: Eagle3Draft, seed: int) -> None:
    """Deterministic random init at a Llama-like scale (for tests and untrained drafts)."""
    generator = torch.Generator().manual_seed(seed)
    for name, param in module.named_parameters():
        if param.dim() == 1 and "norm" in name:
            param.data.fill_(1.0)
        else:
            std = 1.0 / math.sqrt(param.shape[-1]) if param.dim() > 1 else 0.02
            param.data.normal_(0.0, std, generator=generator)
