"""Softmax attention with grouped-query heads, causal masking and packed sequences.

For one sequence, q ``[T, H, Dqk]``, k ``[S, Hk, Dqk]``, v ``[S, Hk, Dv]`` with ``H % Hk == 0``
(query head h reads key/value head ``h // (H // Hk)``):

    s[h, i, j] = scale * q_i . k_j            (masked to -inf where causal and j > i + S - T)
    lse[h, i]  = log sum_j exp(s[h, i, j])    (natural log; -inf when row i sees no key)
    o[i, h]    = sum_j softmax(s[h, i, :])_j v_j   (0 when row i sees no key)

The causal mask is aligned bottom-right: the last query sees every key. MLA is this op with
``Dqk = 192, Dv = 128``. Batched inputs are ``[B, T, ...]``; packed ones have ``B == 1`` with
``cu_seqlens_q`` and ``cu_seqlens_k`` (same number of sequences).
"""
from __future__ import annotations

import torch

from .contract import check_scale, check_shape, check_tensor, sequence_spans


def check_attention_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k):
    """Validate the attention contract; return the paired (row, q span, k span) of each sequence."""
    check_tensor("q", q, 4)
    b, t, h, dqk = q.shape
    check_tensor("k", k, 4)
    s, hk = k.shape[1], k.shape[2]
    check_shape("k", k, (b, s, hk, dqk), "[B, S, Hk, Dqk]")
    check_tensor("v", v, 4)
    check_shape("v", v, (b, s, hk, v.shape[-1]), "[B, S, Hk, Dv]")
    if hk == 0 or h % hk:
        raise ValueError(f"k: the number of key heads ({hk}) must divide the number of query heads ({h})")
    if (cu_seqlens_q is None) != (cu_seqlens_k is None):
        raise ValueError("cu_seqlens_q/cu_seqlens_k: give both or neither")
    q_spans = sequence_spans(cu_seqlens_q, b, t, "cu_seqlens_q")
    k_spans = sequence_spans(cu_seqlens_k, b, s, "cu_seqlens_k")
    if len(k_spans) != len(q_spans):
        raise ValueError(f"cu_seqlens_k: expected {len(q_spans)} sequences like cu_seqlens_q, got {len(k_spans)}")
    return [(row, (qs, qe), (ks, ke)) for (row, qs, qe), (_, ks, ke) in zip(q_spans, k_spans)]


def attention(q, k, v, *, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None):
    """Attention evaluated in ``q.dtype`` (float64 for the truth).

    Returns ``(o [B, T, H, Dv] in q.dtype, lse [B, H, T] in q.dtype)``.
    """
    pairs = check_attention_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k)
    scale = check_scale(scale, q.shape[-1])
    k, v = k.to(q.dtype), v.to(q.dtype)
    groups = q.shape[2] // k.shape[2]
    o_parts, lse_parts = [[] for _ in range(q.shape[0])], [[] for _ in range(q.shape[0])]
    for row, (qs, qe), (ks, ke) in pairs:
        qi = q[row, qs:qe].transpose(0, 1)                                   # [H, T, Dqk]
        kj = k[row, ks:ke].repeat_interleave(groups, dim=1).transpose(0, 1)   # [H, S, Dqk]
        vj = v[row, ks:ke].repeat_interleave(groups, dim=1).transpose(0, 1)   # [H, S, Dv]
        s = scale * qi @ kj.transpose(1, 2)                                   # [H, T, S]
        if causal:
            i = torch.arange(qe - qs, device=q.device).unsqueeze(1)
            j = torch.arange(ke - ks, device=q.device).unsqueeze(0)
            s = s.masked_fill(j > i + (ke - ks) - (qe - qs), float("-inf"))
        # Rows that see no key are kept finite in every branch so that autograd stays NaN-free.
        m = s.amax(-1, keepdim=True) if s.shape[-1] else s.new_full((*s.shape[:2], 1), float("-inf"))
        seen = torch.isfinite(m)
        e = torch.exp(s - torch.where(seen, m, 0.0))
        z = torch.where(seen, e.sum(-1, keepdim=True), 1.0)
        lse = torch.where(seen, m + torch.log(z), float("-inf")).squeeze(-1)  # [H, T]
        o_parts[row].append(((e / z) @ vj).transpose(0, 1))                   # [T, H, Dv]
        lse_parts[row].append(lse)
    o = torch.stack([torch.cat(p) if p else q.new_zeros(0, q.shape[2], v.shape[-1]) for p in o_parts])
    lse = torch.stack([torch.cat(p, dim=1) if p else q.new_zeros(q.shape[2], 0) for p in lse_parts])
    return o, lse
