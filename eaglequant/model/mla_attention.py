"""Multi-head latent attention as vLLM runs it in an MLA EAGLE-3 draft (torch).

Same interface as the Llama attention in :mod:`eaglequant.model.eagle3`:
``project`` gives per-head queries, keys and values for the unrolled steps to
cache, ``attend`` runs the masked attention and ``o_proj``. The math is vLLM's
``MultiHeadLatentAttentionWrapper`` in its plain (non-absorbed) form, which its
MLA backends compute too (prefill) or reassociate (decode absorbs ``kv_b_proj``
into the query and output): queries ``q_b_proj(q_a_layernorm(q_a_proj(x)))``;
``kv_a_proj_with_mqa(x)`` split into the latent (normed by
``kv_a_layernorm``, then ``kv_b_proj`` gives each head's key part and value) and
one RoPE key shared by every head; RoPE interleaved on the last
``qk_rope_head_dim`` of queries and that key; softmax scale ``qk_head_dim**-0.5``
times DeepSeek YaRN's ``mscale**2``. See :mod:`eaglequant.forms.mla`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from eaglequant.forms.mla import MlaDims, Rope, yarn_mscale
from eaglequant.model import compute
from eaglequant.model.norm import RMSNorm


class MlaAttention(nn.Module):
    """One MLA attention over the draft's 2*hidden input; parameters named as in the checkpoint."""

    def __init__(self, hidden: int, heads: int, mla: MlaDims, eps: float) -> None:
        super().__init__()
        self.heads, self.mla = heads, mla
        self.scale = mla.softmax_scale()
        self.q_a_proj = nn.Linear(2 * hidden, mla.q_lora_rank, bias=False)
        self.q_a_layernorm = RMSNorm(mla.q_lora_rank, eps)
        self.q_b_proj = nn.Linear(mla.q_lora_rank, heads * mla.qk_head_dim, bias=False)
        latent = mla.kv_lora_rank
        self.kv_a_proj_with_mqa = nn.Linear(2 * hidden, latent + mla.qk_rope_head_dim, bias=False)
        self.kv_a_layernorm = RMSNorm(latent, eps)
        self.kv_b_proj = nn.Linear(latent, heads * (mla.qk_nope_head_dim + mla.v_head_dim), False)
        self.o_proj = nn.Linear(heads * mla.v_head_dim, hidden, bias=False)

    def project(
        self, x: torch.Tensor, positions: torch.Tensor, gemm_dtype: torch.dtype | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys (batch, heads, seq, qk_head_dim) and values (…, v_head_dim).

        ``gemm_dtype``: the linears compute as vLLM's in it (None: as they are).
        """
        b, t, _ = x.shape
        mla, heads = self.mla, self.heads
        nope, rope = mla.qk_nope_head_dim, mla.qk_rope_head_dim

        def linear(module: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
            return compute.module_linear(module, inputs, gemm_dtype)

        q = linear(self.q_b_proj, self.q_a_layernorm(linear(self.q_a_proj, x)))
        q = q.view(b, t, heads, mla.qk_head_dim)
        latent, k_pe = linear(self.kv_a_proj_with_mqa, x).split([mla.kv_lora_rank, rope], dim=-1)
        kv = linear(self.kv_b_proj, self.kv_a_layernorm(latent))
        kv = kv.view(b, t, heads, nope + mla.v_head_dim)
        k_nope, v = kv.split([nope, mla.v_head_dim], dim=-1)
        cos, sin = rope_cos_sin(mla.rope, rope, positions)  # (b, t, rope)
        q_pe = rotate_interleaved(q[..., nope:], cos[:, :, None], sin[:, :, None])
        k_pe = rotate_interleaved(k_pe, cos, sin)[:, :, None].expand(b, t, heads, rope)
        q = torch.cat([q[..., :nope], q_pe], -1)
        k = torch.cat([k_nope, k_pe], -1)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor,
        gemm_dtype: torch.dtype | None = None,
    ) -> torch.Tensor:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)
        b, _, t, _ = out.shape
        return compute.module_linear(self.o_proj, out.transpose(1, 2).reshape(b, t, -1), gemm_dtype)


def rope_cos_sin(
    rope: Rope, dim: int, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek YaRN's cos and sin (…, dim), each frequency repeated twice (interleaved), as
    vLLM's ``DeepseekScalingRotaryEmbedding`` caches them."""
    pos_freqs = rope.theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)
    inv_freq = _yarn_inv_freq(rope, dim, pos_freqs)
    mscale = yarn_mscale(rope.factor, rope.mscale) / yarn_mscale(rope.factor, rope.mscale_all_dim)
    freqs = positions.float()[..., None] * inv_freq
    cos, sin = freqs.cos() * mscale, freqs.sin() * mscale
    return cos.repeat_interleave(2, -1), sin.repeat_interleave(2, -1)


def _yarn_inv_freq(rope: Rope, dim: int, pos_freqs: torch.Tensor) -> torch.Tensor:
    """vLLM's ``DeepseekScalingRotaryEmbedding._compute_inv_freq``."""
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (rope.factor * pos_freqs)
    low = math.floor(_correction_dim(rope.beta_fast, dim, rope))
    high = math.ceil(_correction_dim(rope.beta_slow, dim, rope))
    low, high = max(low, 0), min(high, dim - 1)
    ramp = (torch.arange(dim // 2, dtype=torch.float) - low) / (
        high - low if high != low else 0.001
    )
    mask = 1 - ramp.clamp(0, 1)
    return interpolation * (1 - mask) + extrapolation * mask


def _correction_dim(rotations: float, dim: int, rope: Rope) -> float:
    ratio = rope.original_max_position / (rotations * 2 * math.pi)
    return (dim * math.log(ratio)) / (2 * math.log(rope.theta))


def rotate_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """GPT-J style RoPE: pairs (x0, x1), (x2, x3), … rotated (vLLM's ``rotate_gptj``)."""
    rotated = torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)
    return x * cos + rotated * sin
