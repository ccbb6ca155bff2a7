"""Softmax attention with grouped-query heads, causal masking, sliding windows, logit softcap, attention
sinks and packed sequences.

For one sequence, q ``[T, H, Dqk]``, k ``[S, Hk, Dqk]``, v ``[S, Hk, Dv]`` with ``H % Hk == 0``
(query head h reads key/value head ``h // (H // Hk)``), the diagonal of row i at key ``d_i = i + S - T``
(aligned bottom-right: the last query's diagonal is the last key):

    r[h, i, j] = scale * q_i . k_j
    s[h, i, j] = softcap * tanh(r / softcap)   (softcap given: Gemma 2, Grok), else r
                 masked to -inf where key j is not visible to row i:
                 causal: j > d_i;  window_size = (left, right): j < d_i - left or j > d_i + right
                 (None on a side: unbounded there; causal bounds the right side at 0)
    lse[h, i]  = log (sum_j exp(s[h, i, j]) + exp(sinks[h]))   (sinks given: gpt-oss's per-head
                 logit, a key of score sinks[h] and value 0; without: -inf when row i sees no key)
    o[i, h]    = sum_j exp(s[h, i, j] - lse[h, i]) v_j          (0 when row i sees no key)

MLA is this op with ``Dqk = 192, Dv = 128``. Batched inputs are ``[B, T, ...]``; packed ones have
``B == 1`` with ``cu_seqlens_q`` and ``cu_seqlens_k`` (same number of sequences); the window and the
diagonal are those of each sequence.

``attention`` evaluates it densely, differentiated by autograd. ``attention_chunked`` is the flash
form of the same math: keys in blocks of ``block_size`` with a running maximum ``m`` and sum ``l``
(the accumulator rescaled by ``exp(m_old - m_new)``), and the flash backward

    P = exp(s - lse),   dP = dO V^T,   D_i = sum_d dO_id O_id,   dS = P * (dP - D + dlse)
    dR = dS * (1 - tanh(r / softcap)^2)   (dS without softcap)
    dq = scale * dR K,  dk = scale * dR^T q,  dv = P^T dO,  dsinks[h] = -sum_i exp(sinks[h] - lse_i) (D_i - dlse_i)

whose ``dP - D`` the dense form never forms (with one key it is 0 in real arithmetic, the difference
of two sums in floating point). The flash form starts each row's running softmax at the sink (m = sinks[h],
l = 1, nothing accumulated: its value is 0).
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


def check_window(window_size):
    """``window_size``: None, or ``(left, right)`` with each side None (unbounded) or an int >= 0 (a window
    wider than the sequence is simply the whole sequence)."""
    if window_size is None:
        return None
    ok = isinstance(window_size, (tuple, list)) and len(window_size) == 2 and all(
        side is None or (isinstance(side, int) and not isinstance(side, bool) and side >= 0) for side in window_size)
    if not ok:
        raise ValueError(f"window_size: expected None or (left, right), each None or an int >= 0, got {window_size!r}")
    return tuple(window_size)


def check_softcap(softcap):
    """``softcap``: None, or a positive finite number."""
    if softcap is None:
        return None
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or not 0 < softcap < float("inf"):
        raise ValueError(f"softcap: expected None or a positive finite number, got {softcap!r}")
    return float(softcap)


class Mask:
    """Which keys row i of one sequence (T queries, S keys) sees: ``d_i - left <= j <= d_i + right``,
    ``d_i = i + S - T``; a side None is unbounded."""

    def __init__(self, t: int, total: int, causal: bool, window):
        left, right = window if window is not None else (None, None)
        if causal:
            right = 0 if right is None else min(right, 0)
        self.t, self.total, self.left, self.right = t, total, left, right

    def visible(self, rows: int, offset: int, n: int, device) -> torch.Tensor | None:
        """``[T, n]`` bool of the keys ``offset .. offset + n`` (None: every key is visible)."""
        if self.left is None and self.right is None:
            return None
        d = torch.arange(rows, device=device).unsqueeze(1) + self.total - self.t
        j = offset + torch.arange(n, device=device).unsqueeze(0)
        seen = torch.ones(rows, n, dtype=torch.bool, device=device)
        if self.left is not None:
            seen &= j >= d - self.left
        if self.right is not None:
            seen &= j <= d + self.right
        return seen


def _scores(qi, kj, scale, mask, offset, softcap):
    """``(s, r)``: the scores ``[H, T, S']`` of the keys ``kj`` (the first at key position ``offset``),
    capped and masked to -inf where ``mask`` hides them, and the raw ``r = scale * q k^T``."""
    r = scale * qi @ kj.transpose(1, 2)
    s = r if softcap is None else softcap * torch.tanh(r / softcap)
    seen = mask.visible(qi.shape[1], offset, kj.shape[1], qi.device)
    return (s if seen is None else s.masked_fill(~seen, float("-inf"))), r


def _dense(qi, kj, vj, scale, mask, softcap, sink):
    """One sequence, densely: ``(o [H, T, Dv], lse [H, T])``; ``sink [H]`` or None, a key of score
    ``sink[h]`` and value 0 appended to every row."""
    s, _ = _scores(qi, kj, scale, mask, 0, softcap)                           # [H, T, S]
    if sink is not None:
        s = torch.cat([s, sink.view(-1, 1, 1).expand(*s.shape[:2], 1)], -1)
        vj = torch.cat([vj, vj.new_zeros(vj.shape[0], 1, vj.shape[-1])], 1)
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
    def forward(ctx, qi, kj, vj, sink, scale, mask, softcap, block):
        h, t, _ = qi.shape
        if sink is None:
            m = qi.new_full((h, t, 1), float("-inf"))
            l = qi.new_zeros(h, t, 1)
        else:                                   # the sink is the first key: score sink[h], value 0
            m = sink.view(-1, 1, 1).expand(h, t, 1).clone()
            l = torch.where(torch.isfinite(m), 1.0, 0.0).to(qi.dtype)
        acc = qi.new_zeros(h, t, vj.shape[-1])
        for b in range(0, kj.shape[1], block):
            s, _ = _scores(qi, kj[:, b:b + block], scale, mask, b, softcap)
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
        ctx.save_for_backward(qi, kj, vj, o, lse, *(() if sink is None else (sink,)))
        ctx.scale, ctx.mask, ctx.softcap, ctx.block = scale, mask, softcap, block
        return o, lse

    @staticmethod
    def backward(ctx, do, dlse):
        qi, kj, vj, o, lse, *sink = ctx.saved_tensors
        do = torch.zeros_like(o) if do is None else do
        dlse = torch.zeros_like(lse) if dlse is None else dlse
        seen = torch.isfinite(lse).unsqueeze(-1)
        base = torch.where(seen, lse.unsqueeze(-1), 0.0)
        delta = (do * o).sum(-1, keepdim=True) - dlse.unsqueeze(-1)            # D - dlse  [H, T, 1]
        dq, dks, dvs = torch.zeros_like(qi), [], []
        for b in range(0, kj.shape[1], ctx.block):
            kb, vb = kj[:, b:b + ctx.block], vj[:, b:b + ctx.block]
            s, r = _scores(qi, kb, ctx.scale, ctx.mask, b, ctx.softcap)
            p = torch.where(seen, torch.exp(s - base), 0.0)
            ds = p * (do @ vb.transpose(1, 2) - delta)
            if ctx.softcap is not None:
                ds = ds * (1 - torch.tanh(r / ctx.softcap) ** 2)
            dq = dq + ctx.scale * ds @ kb
            dks.append(ctx.scale * ds.transpose(1, 2) @ qi)
            dvs.append(p.transpose(1, 2) @ do)
        dk = torch.cat(dks, 1) if dks else torch.zeros_like(kj)
        dv = torch.cat(dvs, 1) if dvs else torch.zeros_like(vj)
        dsink = None
        if sink:
            p_sink = torch.where(seen, torch.exp(sink[0].view(-1, 1, 1) - base), 0.0)     # [H, T, 1]
            dsink = -(p_sink * delta).sum((1, 2))
        return dq, dk, dv, dsink, None, None, None, None


def _attention(q, k, v, causal, scale, cu_seqlens_q, cu_seqlens_k, window_size, softcap, sinks, one):
    """The contract's bookkeeping (checks, GQA, sequences, rows) around
    ``one(qi, kj, vj, scale, mask, softcap, sink)``."""
    pairs = check_attention_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k)
    scale = check_scale(scale, q.shape[-1])
    window, softcap = check_window(window_size), check_softcap(softcap)
    if sinks is not None:
        check_tensor("sinks", sinks, 1)
        check_shape("sinks", sinks, (q.shape[2],), "[H]")
        sinks = sinks.to(q.dtype)
    k, v = k.to(q.dtype), v.to(q.dtype)
    groups = q.shape[2] // k.shape[2]
    o_parts, lse_parts = [[] for _ in range(q.shape[0])], [[] for _ in range(q.shape[0])]
    for row, (qs, qe), (ks, ke) in pairs:
        qi = q[row, qs:qe].transpose(0, 1)                                   # [H, T, Dqk]
        kj = k[row, ks:ke].repeat_interleave(groups, dim=1).transpose(0, 1)   # [H, S, Dqk]
        vj = v[row, ks:ke].repeat_interleave(groups, dim=1).transpose(0, 1)   # [H, S, Dv]
        o, lse = one(qi, kj, vj, scale, Mask(qe - qs, ke - ks, causal, window), softcap, sinks)
        o_parts[row].append(o.transpose(0, 1))                                # [T, H, Dv]
        lse_parts[row].append(lse)
    o = torch.stack([torch.cat(p) if p else q.new_zeros(0, q.shape[2], v.shape[-1]) for p in o_parts])
    lse = torch.stack([torch.cat(p, dim=1) if p else q.new_zeros(q.shape[2], 0) for p in lse_parts])
    return o, lse


def attention(q, k, v, *, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None, window_size=None,
              softcap=None, sinks=None):
    """Attention evaluated in ``q.dtype`` (float64 for the truth), densely, differentiated by autograd.

    window_size: None or ``(left, right)`` keys around each row's diagonal, each side None (unbounded) or an
    int >= 0; softcap: None or a positive number (scores ``softcap * tanh(s / softcap)``, after the scale);
    sinks: None or ``[H]``, one extra logit per query head in every row's softmax (a key of value 0; it has
    a gradient).

    Returns ``(o [B, T, H, Dv], lse [B, H, T])``, computed in ``q.dtype``. A kernel's dtypes are the
    contract's: o in the input dtype, lse in float32.
    """
    return _attention(q, k, v, causal, scale, cu_seqlens_q, cu_seqlens_k, window_size, softcap, sinks, _dense)


def attention_chunked(q, k, v, *, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None, window_size=None,
                      softcap=None, sinks=None, block_size=64):
    """Attention in the flash form (module docstring), keys in blocks of ``block_size``, in ``q.dtype``:
    the same contract and result as ``attention`` (equal to ~1e-15 in float64)."""
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size: expected a positive int, got {block_size!r}")

    def one(qi, kj, vj, scale, mask, softcap, sink):
        return _Flash.apply(qi, kj, vj, sink, scale, mask, softcap, block_size)
    return _attention(q, k, v, causal, scale, cu_seqlens_q, cu_seqlens_k, window_size, softcap, sinks, one)
