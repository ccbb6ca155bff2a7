"""Adapters that give the peers (torch SDPA, flash-linear-attention, flash-attn-4) the refcheck
contract signature. Each one only renames arguments and reshapes; the math is the peer's."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from references.attention import check_attention_inputs


def sdpa_attention(q, k, v, *, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None):
    """torch SDPA per sequence (bottom-right causal mask, GQA by repeating heads); no lse."""
    pairs = check_attention_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k)
    groups = q.shape[2] // k.shape[2]
    out = q.new_zeros(*q.shape[:3], v.shape[-1])
    for row, (qs, qe), (ks, ke) in pairs:
        qi = q[row, qs:qe].transpose(0, 1)
        kj = k[row, ks:ke].repeat_interleave(groups, dim=1).transpose(0, 1)
        vj = v[row, ks:ke].repeat_interleave(groups, dim=1).transpose(0, 1)
        mask = None
        if causal:
            i = torch.arange(qe - qs, device=q.device).unsqueeze(1)
            j = torch.arange(ke - ks, device=q.device).unsqueeze(0)
            mask = j <= i + (ke - ks) - (qe - qs)
        o = F.scaled_dot_product_attention(qi, kj, vj, attn_mask=mask, scale=scale)
        out[row, qs:qe] = o.transpose(0, 1)
    return out, None


def fla_kda(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
            use_qk_l2norm=False, safe_gate=False, lower_bound=None, use_gate_in_kernel=False, A_log=None,
            dt_bias=None):
    """flash-linear-attention ``chunk_kda``."""
    from fla.ops.kda import chunk_kda
    return chunk_kda(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                     output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                     use_qk_l2norm_in_kernel=use_qk_l2norm, safe_gate=safe_gate, lower_bound=lower_bound,
                     use_gate_in_kernel=use_gate_in_kernel, A_log=A_log, dt_bias=dt_bias)


def fla_gla(q, k, v, g, *, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
    """flash-linear-attention ``chunk_gla``."""
    from fla.ops.gla import chunk_gla
    return chunk_gla(q, k, v, g, scale=scale, initial_state=initial_state,
                     output_final_state=output_final_state, cu_seqlens=cu_seqlens)


def fla_simple_gla(q, k, v, g, *, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
    """flash-linear-attention ``chunk_simple_gla``."""
    from fla.ops.simple_gla import chunk_simple_gla
    return chunk_simple_gla(q, k, v, g, scale=scale, initial_state=initial_state,
                            output_final_state=output_final_state, cu_seqlens=cu_seqlens)


def fa4_attention(q, k, v, *, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None):
    """flash-attn-4 ``flash_attn_func`` / ``flash_attn_varlen_func`` (returns o and lse)."""
    from flash_attn.cute import flash_attn_func, flash_attn_varlen_func
    if cu_seqlens_q is None:
        o, lse = flash_attn_func(q, k, v, softmax_scale=scale, causal=causal, return_lse=True)
        return o, lse
    max_q = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max()) if len(cu_seqlens_q) > 1 else 0
    max_k = int((cu_seqlens_k[1:] - cu_seqlens_k[:-1]).max()) if len(cu_seqlens_k) > 1 else 0
    o, lse = flash_attn_varlen_func(q[0], k[0], v[0], cu_seqlens_q.int(), cu_seqlens_k.int(), max_q, max_k,
                                    softmax_scale=scale, causal=causal, return_lse=True)
    return o.unsqueeze(0), lse.unsqueeze(0)
