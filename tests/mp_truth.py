"""The refcheck ops evaluated with mpmath at 50 significant digits, straight from their math.

Used to certify the float64 references on tiny shapes. Inputs are float64 torch tensors, converted
exactly to ``mpf``; results are numpy object arrays of ``mpf`` with the shapes of the op's outputs.
Nothing here is clever: loops over sequences, heads and steps, the formulas of issue 2 as written.
"""
from __future__ import annotations

import mpmath
import numpy as np
import torch

DPS = 50
mp = mpmath.mp
L2NORM_EPS = mpmath.mpf("1e-6")

_exp = np.frompyfunc(lambda x: mp.exp(x), 1, 1)
_sqrt = np.frompyfunc(lambda x: mp.sqrt(x), 1, 1)


def to_mp(x: torch.Tensor | np.ndarray) -> np.ndarray:
    """A float64 tensor as an object array of ``mpf`` (exact: every float64 is an mpf); an object array of
    ``mpf`` as it is."""
    if isinstance(x, np.ndarray):
        return x
    flat = [mpmath.mpf(v) for v in x.detach().to(torch.float64).reshape(-1).tolist()]
    return np.array(flat + [None], dtype=object)[:-1].reshape(tuple(x.shape))


def mp_zeros(*shape: int) -> np.ndarray:
    out = np.empty(shape, dtype=object)
    out.fill(mpmath.mpf(0))
    return out


def softplus(x):
    """``log(1 + exp(x))``; log1p keeps the relative precision where exp(x) is tiny."""
    return mp.log1p(mp.exp(x))


def sigmoid(x):
    return 1 / (1 + mp.exp(-x))


def kda_gate(g, A_log, dt_bias=None, lower_bound=None) -> np.ndarray:
    """g ``[B, T, H, K]``, A_log ``[H]``, dt_bias ``[H*K]`` -> gate ``[B, T, H, K]``."""
    with mp.workdps(DPS):
        g, A_log = to_mp(g), to_mp(A_log)
        h, k = g.shape[2:]
        x = g + (to_mp(dt_bias).reshape(h, k) if dt_bias is not None else 0)
        rate = _exp(A_log).reshape(h, 1)
        if lower_bound is None:
            return -rate * np.frompyfunc(softplus, 1, 1)(x)
        return mpmath.mpf(lower_bound) * np.frompyfunc(sigmoid, 1, 1)(rate * x)


def gate_condition(g, A_log, dt_bias=None, lower_bound=None) -> np.ndarray:
    """Relative condition number of each gate entry under relative perturbations of ``x = g + dt_bias``
    and of ``exp(A_log)``: the error float64 cannot avoid is about ``eps * (1 + condition)``.

    softplus form: ``1 + x sigmoid(x) / softplus(x)``; sigmoid form: ``|z| (1 - sigmoid(z))`` twice
    (once for x, once for the rate), ``z = exp(A_log) x``.
    """
    with mp.workdps(DPS):
        g, A_log = to_mp(g), to_mp(A_log)
        h, k = g.shape[2:]
        x = g + (to_mp(dt_bias).reshape(h, k) if dt_bias is not None else 0)
        if lower_bound is None:
            return np.frompyfunc(lambda v: 1 + abs(v * sigmoid(v) / softplus(v)), 1, 1)(x)
        z = _exp(A_log).reshape(h, 1) * x
        return np.frompyfunc(lambda v: 2 * abs(v) * (1 - sigmoid(v)), 1, 1)(z)


def _spans(cu_seqlens, batch: int, length: int) -> list[tuple[int, int, int]]:
    if cu_seqlens is None:
        return [(b, 0, length) for b in range(batch)]
    bounds = cu_seqlens.tolist()
    return [(0, s, e) for s, e in zip(bounds[:-1], bounds[1:])]


def _l2norm(x: np.ndarray) -> np.ndarray:
    return x / _sqrt((x * x).sum(-1, keepdims=True) + L2NORM_EPS)


def _linear_attention(q, k, v, g, beta, *, scale, initial_state, cu_seqlens):
    """``S' = Diag(exp(g_t)) S``; ``S = S' + beta_t k_t (v_t - S'^T k_t)^T`` (or ``S' + k_t v_t^T``
    when beta is None); ``o_t = scale S^T q_t``. Value head ``i`` of ``HV`` reads query/key head
    ``i // (HV // H)`` (grouped value heads). Returns ``(o [B, T, HV, V], final [N, HV, K, V])``."""
    b, t, hq, kd = q.shape
    h, vd = v.shape[2], v.shape[-1]
    group = h // hq
    o, finals = mp_zeros(b, t, h, vd), []
    for n, (row, start, end) in enumerate(_spans(cu_seqlens, b, t)):
        state = [initial_state[n, i].copy() if initial_state is not None else mp_zeros(kd, vd) for i in range(h)]
        for step in range(start, end):
            for i in range(h):
                s = _exp(g[row, step, i]).reshape(kd, 1) * state[i]
                kt, vt = k[row, step, i // group], v[row, step, i]
                if beta is None:
                    s = s + np.outer(kt, vt)
                else:
                    s = s + beta[row, step, i] * np.outer(kt, vt - s.T @ kt)
                state[i] = s
                o[row, step, i] = scale * (s.T @ q[row, step, i // group])
        finals.append(np.stack(state))
    return o, np.stack(finals)


def kda(q, k, v, g, beta, *, scale=None, initial_state=None, cu_seqlens=None, use_qk_l2norm=False,
        lower_bound=None, use_gate_in_kernel=False, A_log=None, dt_bias=None):
    """The kda contract at 50 digits; returns ``(o, final_state)`` as object arrays."""
    gate = kda_gate(g, A_log, dt_bias, lower_bound) if use_gate_in_kernel else None
    with mp.workdps(DPS):
        q, k, v, beta = to_mp(q), to_mp(k), to_mp(v), to_mp(beta)
        if use_qk_l2norm:
            q, k = _l2norm(q), _l2norm(k)
        scale = mpmath.mpf(q.shape[-1]) ** -0.5 if scale is None else mpmath.mpf(scale)
        h0 = to_mp(initial_state) if initial_state is not None else None
        return _linear_attention(q, k, v, gate if gate is not None else to_mp(g), beta, scale=scale,
                                 initial_state=h0, cu_seqlens=cu_seqlens)


def gated_delta_rule(q, k, v, g, beta, *, scale=None, initial_state=None, cu_seqlens=None, use_qk_l2norm=False,
                     use_gate_in_kernel=False, A_log=None, dt_bias=None, use_beta_sigmoid_in_kernel=False,
                     allow_neg_eigval=False, state_v_first=False):
    """The gated_delta_rule contract at 50 digits (g ``[B, T, HV]``, one decay per value head and step;
    with ``use_gate_in_kernel`` ``-exp(A_log[j]) * softplus(g + dt_bias[j])`` for value head j: kda's gate
    with the same value in every channel; with ``use_beta_sigmoid_in_kernel`` beta is ``1 / (1 + e^-beta)``
    at 50 digits, doubled with ``allow_neg_eigval``; with ``state_v_first`` the states are ``[.., V, K]``)."""
    kd = q.shape[-1]
    gate = g.unsqueeze(-1).expand(*g.shape, kd)
    if use_gate_in_kernel and dt_bias is not None:
        dt_bias = dt_bias.repeat_interleave(kd)
    if use_beta_sigmoid_in_kernel:
        with mp.workdps(DPS):
            beta = np.vectorize(lambda x: (2 if allow_neg_eigval else 1) / (1 + mp.exp(-x)), otypes=[object])(to_mp(beta))
    if initial_state is not None and state_v_first:
        initial_state = initial_state.transpose(-1, -2)
    o, final = kda(q, k, v, gate, beta, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
                   use_qk_l2norm=use_qk_l2norm, use_gate_in_kernel=use_gate_in_kernel, A_log=A_log, dt_bias=dt_bias)
    return o, (final.transpose(0, 1, 3, 2) if state_v_first else final)


def gla(q, k, v, g, *, scale=None, initial_state=None, cu_seqlens=None):
    """The gla contract at 50 digits (g ``[B, T, H, K]``); returns ``(o, final_state)``."""
    with mp.workdps(DPS):
        q, k, v, g = to_mp(q), to_mp(k), to_mp(v), to_mp(g)
        scale = mpmath.mpf(q.shape[-1]) ** -0.5 if scale is None else mpmath.mpf(scale)
        h0 = to_mp(initial_state) if initial_state is not None else None
        return _linear_attention(q, k, v, g, None, scale=scale, initial_state=h0, cu_seqlens=cu_seqlens)


def simple_gla(q, k, v, g, *, scale=None, initial_state=None, cu_seqlens=None):
    """The simple_gla contract at 50 digits (g ``[B, T, H]``, one decay per head and step)."""
    return gla(q, k, v, g.unsqueeze(-1).expand(q.shape), scale=scale, initial_state=initial_state,
               cu_seqlens=cu_seqlens)


def attention(q, k, v, *, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None, window_size=None,
              softcap=None, sinks=None):
    """The attention contract at 50 digits; returns ``(o [B, T, H, Dv], lse [B, H, T])``.

    Row i of a sequence of T queries and S keys sees key j when ``i + S - T - left <= j <= i + S - T + right``
    (causal: right = 0; a side None: unbounded); softcap caps the scaled score, ``c tanh(s / c)``; a sink adds
    ``exp(sinks[h])`` to the denominator. A row that sees no key (and has no sink) gets ``o = 0`` and
    ``lse = -inf``.
    """
    with mp.workdps(DPS):
        b, t, h, dqk = q.shape
        s_len, hk, dv = k.shape[1], k.shape[2], v.shape[-1]
        q, k, v = to_mp(q), to_mp(k), to_mp(v)
        sink = None if sinks is None else to_mp(sinks)
        scale = mpmath.mpf(dqk) ** -0.5 if scale is None else mpmath.mpf(scale)
        left, right = window_size if window_size is not None else (None, None)
        if causal:
            right = 0 if right is None else min(right, 0)
        o, lse = mp_zeros(b, t, h, dv), mp_zeros(b, h, t)
        for (row, qs, qe), (_, ks, ke) in zip(_spans(cu_seqlens_q, b, t), _spans(cu_seqlens_k, b, s_len)):
            for i in range(qs, qe):
                diagonal = (i - qs) + (ke - ks) - (qe - qs)              # in key positions of the sequence
                keys = [j for j in range(ks, ke) if (left is None or j - ks >= diagonal - left)
                        and (right is None or j - ks <= diagonal + right)]
                for head in range(h):
                    kv = head // (h // hk)
                    scores = []
                    for j in keys:
                        raw = scale * (q[row, i, head] @ k[row, j, kv])
                        scores.append(raw if softcap is None else mpmath.mpf(softcap) * mp.tanh(raw / softcap))
                    terms = [mp.exp(x) for x in scores] + ([] if sink is None else [mp.exp(sink[head])])
                    if not terms:
                        lse[row, head, i] = mpmath.mpf("-inf")
                        continue
                    total = mp.log(mp.fsum(terms))
                    lse[row, head, i] = total
                    o[row, i, head] = sum((mp.exp(x - total) * v[row, j, kv] for x, j in zip(scores, keys)),
                                          mp_zeros(dv))
        return o, lse


def paged_attention(q, k_cache, v_cache, block_table, seqused_k, *, scale=None):
    """Paged decode at 50 digits, read key by key through the block table (no gathering); returns
    ``(o [N, Tq, H, Dv], lse [N, H, Tq])``. Query i of sequence n is its token ``L - Tq + i`` and sees keys
    ``0 .. L - Tq + i``; key j is row ``j % page`` of page ``block_table[n, j // page]``."""
    with mp.workdps(DPS):
        n, tq, h, dqk = q.shape
        page, hk, dv = k_cache.shape[1], k_cache.shape[2], v_cache.shape[-1]
        q, kc, vc = to_mp(q), to_mp(k_cache), to_mp(v_cache)
        scale = mpmath.mpf(dqk) ** -0.5 if scale is None else mpmath.mpf(scale)
        table, used = block_table.tolist(), seqused_k.tolist()
        o, lse = mp_zeros(n, tq, h, dv), mp_zeros(n, h, tq)
        for seq in range(n):
            where = [(table[seq][j // page], j % page) for j in range(used[seq])]
            for i in range(tq):
                keys = where[:used[seq] - tq + i + 1]
                for head in range(h):
                    kv = head // (h // hk)
                    scores = [scale * (q[seq, i, head] @ kc[p, r, kv]) for p, r in keys]
                    total = mp.log(mp.fsum(mp.exp(x) for x in scores))
                    lse[seq, head, i] = total
                    o[seq, i, head] = sum((mp.exp(x - total) * vc[p, r, kv] for x, (p, r) in zip(scores, keys)),
                                          mp_zeros(dv))
        return o, lse


def relative_error(x: torch.Tensor, truth: np.ndarray) -> float:
    """``||x - truth|| / ||truth||`` (Frobenius), evaluated at 50 digits; 0 when both are 0."""
    with mp.workdps(DPS):
        x = to_mp(x)
        num = mp.sqrt(mp.fsum(d * d for d in (x - truth).reshape(-1)))
        den = mp.sqrt(mp.fsum(d * d for d in truth.reshape(-1)))
        return float(num / den) if den else float(num)
