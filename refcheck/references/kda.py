"""KDA (Kimi Delta Attention): the gated delta rule with a per-channel decay.

Per sequence and head, with the state ``S`` of shape ``[K, V]`` and at step t
``q_t, k_t [K]``, ``v_t [V]``, ``g_t [K]`` (log-decay), ``beta_t`` (scalar):

    S'  = Diag(exp(g_t)) S_{t-1}
    S_t = S' + beta_t k_t (v_t - S'^T k_t)^T
    o_t = scale * S_t^T q_t

Shapes: q, k ``[B, T, H, K]``; v ``[B, T, H, V]``; g ``[B, T, H, K]``; beta ``[B, T, H]``;
states ``[N, H, K, V]`` (N: the number of sequences, B unless packed). With ``use_qk_l2norm`` q and k are
first divided by their L2 norm (``x / sqrt(sum(x^2) + 1e-6)``); with ``use_gate_in_kernel`` the decay is
``kda_gate(g, A_log, dt_bias, lower_bound)``; ``safe_gate`` promises ``lower_bound <= decay <= 0``.
A decode step over a state pool (serving's continuous batching): with ``ssm_state_indices [N]`` the
initial state is a pool ``[P, H, K, V]`` and sequence n starts from slot ``ssm_state_indices[n]``; with
``inplace_final_state`` its final state is written back into that slot, in place (the contract's one
side effect), and none is returned (``recurrence.over_sequences``).

``kda`` walks the recurrence step by step; ``kda_chunked`` evaluates the same math in chunks
(``chunk.chunk_scan`` with the WY form of the delta rule, ``delta_rule_write``).
"""
from __future__ import annotations

import torch

from .chunk import PairDecays, check_chunk_size, chunk_scan, decayed_gram
from .contract import check_linear_qkv, check_scale, check_shape, check_tensor
from .gates import kda_gate
from .recurrence import scan

L2NORM_EPS = 1e-6
SAFE_GATE_LOWER_BOUND_RANGE = (-5.0, 0.0)


def l2norm(x: torch.Tensor) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + 1e-6)`` along the last dimension."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


def check_kda_inputs(q, k, v, g, beta, *, safe_gate, lower_bound, use_gate_in_kernel, A_log, dt_bias):
    """Validate the kda contract (shared by every implementation); return (B, T, H, K, V)."""
    b, t, h, kd, vd = check_linear_qkv(q, k, v)
    check_tensor("g", g, 4)
    check_shape("g", g, q.shape, "[B, T, H, K] like q")
    check_tensor("beta", beta, 3)
    check_shape("beta", beta, (b, t, h), "[B, T, H]")
    if use_gate_in_kernel:
        if A_log is None:
            raise ValueError("A_log: required when use_gate_in_kernel=True")
    elif A_log is not None or dt_bias is not None:
        raise ValueError("A_log/dt_bias: only used with use_gate_in_kernel=True")
    if safe_gate:
        lo, hi = SAFE_GATE_LOWER_BOUND_RANGE
        if lower_bound is None:
            raise ValueError("lower_bound: required when safe_gate=True")
        if not isinstance(lower_bound, (int, float)) or not lo <= lower_bound < hi:
            raise ValueError(f"lower_bound: expected a number in [{lo}, {hi}) with safe_gate, got {lower_bound!r}")
    elif lower_bound is not None and not use_gate_in_kernel:
        raise ValueError("lower_bound: only used with safe_gate=True or use_gate_in_kernel=True")
    return b, t, h, kd, vd


def kda_operands(q, k, v, g, beta, *, scale, use_qk_l2norm, safe_gate, lower_bound, use_gate_in_kernel,
                 A_log, dt_bias):
    """Check the kda inputs and bring them to what the recurrence reads, in ``q.dtype``.

    Returns ``(q, k, v, g, beta, scale, K, V)``: g replaced by ``kda_gate(g, A_log, dt_bias,
    lower_bound)`` with ``use_gate_in_kernel``, q and k L2-normalized with ``use_qk_l2norm``.
    """
    *_, kd, vd = check_kda_inputs(q, k, v, g, beta, safe_gate=safe_gate, lower_bound=lower_bound,
                                  use_gate_in_kernel=use_gate_in_kernel, A_log=A_log, dt_bias=dt_bias)
    scale = check_scale(scale, kd)
    dt = q.dtype
    q, k, v, g, beta = (x.to(dt) for x in (q, k, v, g, beta))
    if use_gate_in_kernel:   # lower_bound * sigmoid(.) or -softplus(.): in the safe range by construction
        g = kda_gate(g, A_log, dt_bias, lower_bound)
    elif safe_gate and not (bool((g <= 0).all()) and bool((g >= lower_bound).all())):
        raise ValueError(f"g: safe_gate promises lower_bound ({lower_bound}) <= g <= 0")
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    return q, k, v, g, beta, scale, kd, vd


def kda(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
        use_qk_l2norm=False, safe_gate=False, lower_bound=None, use_gate_in_kernel=False, A_log=None,
        dt_bias=None, ssm_state_indices=None, inplace_final_state=False):
    """KDA by its recurrence, evaluated in ``q.dtype`` (float64 for the truth).

    Returns ``(o [B, T, H, V], final_state [N, H, K, V] or None)``, computed in ``q.dtype``. A kernel's
    dtypes are the contract's: o in the input dtype, final_state in float32.
    """
    q, k, v, g, beta, scale, kd, vd = kda_operands(
        q, k, v, g, beta, scale=scale, use_qk_l2norm=use_qk_l2norm, safe_gate=safe_gate,
        lower_bound=lower_bound, use_gate_in_kernel=use_gate_in_kernel, A_log=A_log, dt_bias=dt_bias)

    def step(state, x):
        state = state * torch.exp(x["g"]).unsqueeze(-1)
        u = x["v"] - torch.einsum("hkv,hk->hv", state, x["k"])
        state = state + x["beta"][:, None, None] * x["k"].unsqueeze(-1) * u.unsqueeze(-2)
        return state, scale * torch.einsum("hkv,hk->hv", state, x["q"])

    return scan(step, dict(q=q, k=k, v=v, g=g, beta=beta), kd, vd, initial_state, output_final_state,
                cu_seqlens, state_indices=ssm_state_indices, inplace_final_state=inplace_final_state)


def unit_lower_solve(lower: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """``(I + L)^{-1} rhs`` for a strictly lower ``L [..., C, C]`` (only its strict lower part is
    read) in the dtype of the operands: LAPACK's triangular solve where torch has one (float32,
    float64), else forward substitution row by row (bf16, fp16 on the CPU: the naive yardstick)."""
    if lower.dtype in (torch.float32, torch.float64):
        return torch.linalg.solve_triangular(lower, rhs, upper=False, unitriangular=True)
    rows: list[torch.Tensor] = []
    for i in range(rhs.shape[-2]):
        done = torch.stack(rows, -2) if rows else rhs[..., :0, :]
        rows.append(rhs[..., i, :] - (lower[..., i:i + 1, :i] @ done).squeeze(-2))
    return torch.stack(rows, -2)


def delta_rule_write(x: dict[str, torch.Tensor], G: torch.Tensor,
                     decays: PairDecays) -> tuple[torch.Tensor, torch.Tensor]:
    """The values KDA writes in a chunk, affine in the chunk's entry state S0: ``U = Wv - Wk S0``.

    In a chunk (rows i = 0..C-1, see ``chunk``), ``u_i = beta_i (v_i - S'_i^T k_i)`` with
    ``S'_i = Diag(exp(g_i)) S_{i-1} = Diag(exp(G_i)) S0 + sum_{j<i} Diag(exp(G_i - G_j)) k_j u_j^T``:

        (I + L) U = Diag(beta) (V - (Kc * exp(G)) S0),   L = strictly-lower(beta_i Akk[i, j]),
        Akk[i, j] = sum_k Kc_ik Kc_jk exp(G_ik - G_jk)

    so, in the WY form, ``Wv = (I + L)^{-1} Diag(beta) V`` ``[H, C, V]`` and
    ``Wk = (I + L)^{-1} Diag(beta) (Kc * exp(G))`` ``[H, C, K]``, by one unit-lower-triangular solve.
    x holds k ``[H, C, K]``, v ``[H, C, V]`` and beta ``[H, C]``; G is ``[H, C, K]``.
    """
    k, v, beta = x["k"], x["v"], x["beta"].unsqueeze(-1)
    lower = beta * decayed_gram(k, k, decays).tril(-1)
    rhs = beta * torch.cat([v, k * torch.exp(G)], -1)
    w = unit_lower_solve(lower, rhs)
    return w[..., :v.shape[-1]], w[..., v.shape[-1]:]


def kda_chunked(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False,
                cu_seqlens=None, use_qk_l2norm=False, safe_gate=False, lower_bound=None,
                use_gate_in_kernel=False, A_log=None, dt_bias=None, ssm_state_indices=None,
                inplace_final_state=False, chunk_size=64, decays="stable"):
    """KDA in chunks of ``chunk_size`` steps (``chunk.chunk_scan`` with ``delta_rule_write``).

    Same contract and result as ``kda`` (to rounding), in ``q.dtype``; ``chunk_size`` is any positive
    int (a sequence's last chunk may be partial); ``decays`` how the in-chunk decays are formed
    (``chunk.DECAY_FORMS``: ``stable`` for the truth, ``differenced`` as kernels form them). Returns
    ``(o [B, T, H, V], final_state
    [N, H, K, V] or None)``.
    """
    chunk_size = check_chunk_size(chunk_size)
    q, k, v, g, beta, scale, kd, vd = kda_operands(
        q, k, v, g, beta, scale=scale, use_qk_l2norm=use_qk_l2norm, safe_gate=safe_gate,
        lower_bound=lower_bound, use_gate_in_kernel=use_gate_in_kernel, A_log=A_log, dt_bias=dt_bias)
    return chunk_scan(dict(q=q, k=k, v=v, g=g, beta=beta), delta_rule_write, scale, kd, vd, initial_state,
                      output_final_state, cu_seqlens, chunk_size, decays, state_indices=ssm_state_indices,
                      inplace_final_state=inplace_final_state)
