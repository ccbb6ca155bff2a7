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


def fla_gated_chunk_backward_refusal(device: str, case=None) -> str | None:
    """Why flash-linear-attention refuses ``chunk_simple_gla``'s backward on ``device`` (any case),
    or None: on Hopper with Triton >= 3.4.0 and < 3.7.1 its gated ``chunk_bwd_dqkwg`` raises
    RuntimeError ("produces incorrect results ... see #640"), its own flags deciding."""
    if torch.device(device).type != "cuda":
        return None
    from fla.utils import IS_NVIDIA_HOPPER, TRITON_ABOVE_3_4_0, TRITON_ABOVE_3_7_1
    if IS_NVIDIA_HOPPER and TRITON_ABOVE_3_4_0 and not TRITON_ABOVE_3_7_1:
        import triton
        return (f"flash-linear-attention refuses the gated chunk backward on Hopper with triton {triton.__version__} "
                "(>= 3.4.0, < 3.7.1: 'produces incorrect results', fla-org/flash-linear-attention#640)")
    return None


def fa4_backward_refusal(device: str, case=None) -> str | None:
    """Why flash-attn-4 refuses the backward of ``case``, or None: with GQA (H != Hk) it asserts
    "GQA backward requires head_dim == head_dim_v" (4.0.0b36), so MLA's 192/128 with GQA is
    checked forward only."""
    if case is None:
        return None
    d = case.dim
    if d["H"] != d["Hk"] and d["Dqk"] != d["Dv"]:
        return "flash-attn-4: 'GQA backward requires head_dim == head_dim_v'"
    return None


def fla_recurrent_kda(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False,
                      cu_seqlens=None, use_qk_l2norm=False, safe_gate=False, lower_bound=None,
                      use_gate_in_kernel=False, A_log=None, dt_bias=None):
    """flash-linear-attention ``fused_recurrent_kda`` (forward only). ``safe_gate`` promises
    ``lower_bound <= g <= 0``, which the chunked kernels exploit and a recurrence does not need;
    ``lower_bound`` takes part in the gate only when it is computed in the kernel."""
    from fla.ops.kda import fused_recurrent_kda
    return fused_recurrent_kda(q, k, v, g, beta, A_log=A_log, dt_bias=dt_bias, scale=scale,
                               initial_state=initial_state, output_final_state=output_final_state,
                               use_qk_l2norm_in_kernel=use_qk_l2norm, use_gate_in_kernel=use_gate_in_kernel,
                               lower_bound=lower_bound if use_gate_in_kernel else None, cu_seqlens=cu_seqlens)


def fla_recurrent_gla(q, k, v, g, *, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
    """flash-linear-attention ``fused_recurrent_gla`` (the per-key gate is its ``gk``)."""
    from fla.ops.gla import fused_recurrent_gla
    return fused_recurrent_gla(q, k, v, gk=g, scale=scale, initial_state=initial_state,
                               output_final_state=output_final_state, cu_seqlens=cu_seqlens)


def fla_recurrent_simple_gla(q, k, v, g, *, scale=None, initial_state=None, output_final_state=False,
                             cu_seqlens=None):
    """flash-linear-attention ``fused_recurrent_simple_gla``."""
    from fla.ops.simple_gla import fused_recurrent_simple_gla
    return fused_recurrent_simple_gla(q, k, v, g=g, scale=scale, initial_state=initial_state,
                                      output_final_state=output_final_state, cu_seqlens=cu_seqlens)


def fa4_attention(q, k, v, *, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None):
    """flash-attn-4 ``flash_attn_func`` / ``flash_attn_varlen_func``: o and lse (``[B, H, T]``;
    packed, its ``[H, total]`` gets the batch axis of one)."""
    from flash_attn.cute import flash_attn_func, flash_attn_varlen_func
    if cu_seqlens_q is None:
        return flash_attn_func(q, k, v, softmax_scale=scale, causal=causal, return_lse=True)
    lengths_q, lengths_k = cu_seqlens_q.diff(), cu_seqlens_k.diff()
    o, lse = flash_attn_varlen_func(q[0], k[0], v[0], cu_seqlens_q=cu_seqlens_q.int(), cu_seqlens_k=cu_seqlens_k.int(),
                                    max_seqlen_q=int(lengths_q.max()) if len(lengths_q) else 0,
                                    max_seqlen_k=int(lengths_k.max()) if len(lengths_k) else 0,
                                    softmax_scale=scale, causal=causal, return_lse=True)
    return o.unsqueeze(0), lse.unsqueeze(0)
