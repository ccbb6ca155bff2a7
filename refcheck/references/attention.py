"""Softmax attention with grouped-query heads, causal masking and packed sequences.

For one sequence, q ``[T, H, Dqk]``, k ``[S, Hk, Dqk]``, v ``[S, Hk, Dv]`` with ``H % Hk == 0``
(query head h reads key/value head ``h // (H // Hk)``):

    s[h, i, j] = scale * q_i . k_j            (masked to -inf where causal and j > i + S - T)
    lse[h, i]  = log sum_j exp(s[h, i, j])    (natural log; -inf when row i sees no key)
    o[i, h]    = sum_j softmax(s[h, i, :])_j v_j   (0 when row i sees no key)

The causal mask is aligned bottom-right: the last query sees every key. MLA is this op with
``Dqk = 192, Dv = 128``. Batched inputs are ``[B, T, ...]``; packed ones have ``B == 1`` with
``cu_seqlens_q`` and ``cu_seqlens_k`` (same number of sequences).

``attention`` evaluates it densely, differentiated by autograd. ``attention_chunked`` is the flash
form of the same math: keys in blocks of ``block_size`` with a running maximum ``m`` and sum ``l``
(the accumulator rescaled by ``exp(m_old - m_new)``), and the flash backward

    P = exp(s - lse),   dP = dO V^T,   D_i = sum_d dO_id O_id,   dS = P * (dP - D + dlse)
    dq = scale * dS K,  dk = scale * dS^T q,  dv = P^T dO

whose ``dP - D`` the dense form never forms (with one key it is 0 in real arithmetic, the difference
of two sums in floating point).
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


def _scores(qi, kj, scale, causal, offset):
    """``scale * q k^T`` ``[H, T, S']`` of the keys ``kj`` (the first at key position ``offset`` of a
    sequence of ``S`` keys, ``causal = (T, S)`` or None), masked to -inf where a causal row does not see them."""
    s = scale * qi @ kj.transpose(1, 2)
    if causal is not None:
        t, total = causal
        i = torch.arange(qi.shape[1], device=qi.device).unsqueeze(1)
        j = offset + torch.arange(kj.shape[1], device=qi.device).unsqueeze(0)
        s = s.masked_fill(j > i + total - t, float("-inf"))
    return s


def _dense(qi, kj, vj, scale, causal):
    """One sequence, densely: ``(o [H, T, Dv], lse [H, T])``."""
    s = _scores(qi, kj, scale, causal, 0)                                     # [H, T, S]
    # Rows that see no key are kept finite in every branch so that autograd stays NaN-free.
    m = s.amax(-1, keepdim=True) if s.shape[-1] else s.new_full((*s.shape[:2], 1), float("-inf"))
    seen = torch.isfinite(m)
    e = torch.exp(s - torch.where(seen, m, 0.0))
    z = torch.where(seen, e.sum(-1, keepdim=True), 1.0)
    lse = torch.where(seen, m + torch.log(z), float("-inf")).squeeze(-1)      # [H, T]
    return (e / z) @ vj, lse


class _Flash(torch.autograd.Function):
    """One sequence in the flash form (module docstring): blocks of keys forward, the flash backward."""

    @staticmethod
    def forward(ctx, qi, kj, vj, scale, causal, block):
        h, t, _ = qi.shape
        m = qi.new_full((h, t, 1), float("-inf"))
        l = qi.new_zeros(h, t, 1)
        acc = qi.new_zeros(h, t, vj.shape[-1])
        for b in range(0, kj.shape[1], block):
            s = _scores(qi, kj[:, b:b + block], scale, causal, b)
            top = torch.maximum(m, s.amax(-1, keepdim=True))
            seen = torch.isfinite(top)
            rescale = torch.where(seen, torch.exp(m - torch.where(seen, top, 0.0)), 0.0)
            p = torch.exp(s - torch.where(seen, top, 0.0))
            l = rescale * l + p.sum(-1, keepdim=True)
            acc = rescale * acc + p @ vj[:, b:b + block]
            m = top
        seen = l > 0
        o = torch.where(seen, acc / torch.where(seen, l, 1.0), 0.0)
        lse = torch.where(seen, m + torch.log(torch.where(seen, l, 1.0)), float("-inf")).squeeze(-1)
        ctx.save_for_backward(qi, kj, vj, o, lse)
        ctx.scale, ctx.causal, ctx.block = scale, causal, block
        return o, lse

    @staticmethod
    def backward(ctx, do, dlse):
        qi, kj, vj, o, lse = ctx.saved_tensors
        do = torch.zeros_like(o) if do is None else do
        dlse = torch.zeros_like(lse) if dlse is None else dlse
        seen = torch.isfinite(lse).unsqueeze(-1)
        base = torch.where(seen, lse.unsqueeze(-1), 0.0)
        delta = (do * o).sum(-1, keepdim=True) - dlse.unsqueeze(-1)            # D - dlse  [H, T, 1]
        dq, dks, dvs = torch.zeros_like(qi), [], []
        for b in range(0, kj.shape[1], ctx.block):
            kb, vb = kj[:, b:b + ctx.block], vj[:, b:b + ctx.block]
            p = torch.where(seen, torch.exp(_scores(qi, kb, ctx.scale, ctx.causal, b) - base), 0.0)
            ds = p * (do @ vb.transpose(1, 2) - delta)
            dq = dq + ctx.scale * ds @ kb
            dks.append(ctx.scale * ds.transpose(1, 2) @ qi)
            dvs.append(p.transpose(1, 2) @ do)
        dk = torch.cat(dks, 1) if dks else torch.zeros_like(kj)
        dv = torch.cat(dvs, 1) if dvs else torch.zeros_like(vj)
        return dq, dk, dv, None, None, None


def _attention(q, k, v, causal, scale, cu_seqlens_q, cu_seqlens_k, one):
    """The contract's bookkeeping (checks, GQA, sequences, rows) around ``one(qi, kj, vj, scale, causal)``."""
    pairs = check_attention_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k)
    scale = check_scale(scale, q.shape[-1])
    k, v = k.to(q.dtype), v.to(q.dtype)
    groups = q.shape[2] // k.shape[2]
    o_parts, lse_parts = [[] for _ in range(q.shape[0])], [[] for _ in range(q.shape[0])]
    for row, (qs, qe), (ks, ke) in pairs:
        qi = q[row, qs:qe].transpose(0, 1)                                   # [H, T, Dqk]
        kj = k[row, ks:ke].repeat_interleave(groups, dim=1).transpose(0, 1)   # [H, S, Dqk]
        vj = v[row, ks:ke].repeat_interleave(groups, dim=1).transpose(0, 1)   # [H, S, Dv]
        o, lse = one(qi, kj, vj, scale, (qe - qs, ke - ks) if causal else None)
        o_parts[row].append(o.transpose(0, 1))                                # [T, H, Dv]
        lse_parts[row].append(lse)
    o = torch.stack([torch.cat(p) if p else q.new_zeros(0, q.shape[2], v.shape[-1]) for p in o_parts])
    lse = torch.stack([torch.cat(p, dim=1) if p else q.new_zeros(q.shape[2], 0) for p in lse_parts])
    return o, lse


def attention(q, k, v, *, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None):
    """Attention evaluated in ``q.dtype`` (float64 for the truth), densely, differentiated by autograd.

    Returns ``(o [B, T, H, Dv], lse [B, H, T])``, computed in ``q.dtype``. A kernel's dtypes are the
    contract's: o in the input dtype, lse in float32.
    """
    return _attention(q, k, v, causal, scale, cu_seqlens_q, cu_seqlens_k, _dense)


def attention_chunked(q, k, v, *, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None, block_size=64):
    """Attention in the flash form (module docstring), keys in blocks of ``block_size``, in ``q.dtype``:
    the same contract and result as ``attention`` (equal to ~1e-15 in float64)."""
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size: expected a positive int, got {block_size!r}")
    return _attention(q, k, v, causal, scale, cu_seqlens_q, cu_seqlens_k,
                      lambda qi, kj, vj, scale, causal: _Flash.apply(qi, kj, vj, scale, causal, block_size))
