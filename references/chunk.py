"""Chunked evaluation of the gated linear-attention recurrences (GLA, simple GLA, KDA).

Per sequence and head these ops share one recurrence: with a log-decay ``g_t [K]`` and a written
value ``u_t [V]``,

    S_t = Diag(exp(g_t)) S_{t-1} + k_t u_t^T,        o_t = scale * S_t^T q_t

(GLA writes ``u_t = v_t``; KDA writes the delta-rule correction, see ``kda.kda_chunked``).
Cut a sequence into chunks of C steps. In a chunk that starts from the state ``S0 [K, V]``, with the
in-chunk cumulative log-decay ``G_i = sum_{s<=i} g_s`` (rows of ``G [C, K]``, i = 0..C-1):

    S_i = Diag(exp(G_i)) S0 + sum_{j<=i} Diag(exp(G_i - G_j)) k_j u_j^T

so that, with ``Q, Kc [C, K]`` and ``U [C, V]`` the chunk's rows:

    O     = scale * (Q * exp(G)) S0 + Aqk U           Aqk[i, j] = scale * sum_k Q_ik Kc_jk exp(G_ik - G_jk), j <= i
    S_end = Diag(exp(G_last)) S0 + (Kc * exp(G_last - G))^T U

The written values are affine in the entry state, ``U = Wv - Wk S0`` (``Wv [C, V]``, ``Wk [C, K]``;
GLA: ``Wv = V``, ``Wk = 0``), so everything but the short pass over chunks runs for all chunks at once.

Numerics: decays may be as steep as ``g = -1000`` per step, so ``exp`` is only ever taken of
``G_i - G_j`` with ``j <= i``, of ``G_i`` or of ``G_last - G_j``: sums of log-decays, ``<= 0`` when
``g <= 0``. Above the diagonal the exponent is masked to ``-inf`` before ``exp``, never after.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from .contract import check_state, sequence_spans

# Rows of a chunk handled together by ``decayed_gram``: its pairwise [rows, rows, K] tensors cost
# C * SUB_CHUNK * K per chunk instead of C * C * K, the rest is matrix products.
SUB_CHUNK = 16

Chunks = dict[str, torch.Tensor]
Write = Callable[[Chunks, torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]]


def check_chunk_size(chunk_size) -> int:
    """The number of steps per chunk: a positive int."""
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size: expected a positive int, got {chunk_size!r}")
    return chunk_size


def to_chunks(x: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """``[L, H, ...]`` -> ``[H, ceil(L / C), C, ...]``, zero-padded after the last step.

    Zero padding is exact for every operand: a padded step has ``g = 0`` (decay 1), ``k = 0`` and
    ``beta = 0``, so it leaves the state unchanged; its outputs are dropped.
    """
    length = x.shape[0]
    n = -(-length // chunk_size)
    pad = x.new_zeros(n * chunk_size - length, *x.shape[1:])
    x = torch.cat([x, pad]).reshape(n, chunk_size, *x.shape[1:])
    return x.movedim(2, 0)


def decayed_gram(x: torch.Tensor, y: torch.Tensor, G: torch.Tensor, *, strict: bool) -> torch.Tensor:
    """``P[..., i, j] = sum_k x_ik y_jk exp(G_ik - G_jk)`` for ``j <= i`` (``j < i`` if strict), else 0.

    x, y, G: ``[..., C, K]`` -> P ``[..., C, C]``. Rows go in blocks of ``SUB_CHUNK``. In the block's
    diagonal square the exponent is formed pair by pair and masked above the diagonal before ``exp``.
    Left of it, with the reference row ``r`` just before the block (``j <= r < i``), the pair
    factorizes, ``exp(G_i - G_j) = exp(G_i - G_r) exp(G_r - G_j)``, both exponents ``<= 0`` for
    decays, and the block is one matrix product.
    """
    c = x.shape[-2]
    rows = []
    for r0 in range(0, c, SUB_CHUNK):
        r1 = min(r0 + SUB_CHUNK, c)
        xi, gi = x[..., r0:r1, :], G[..., r0:r1, :]
        keep = torch.ones(r1 - r0, r1 - r0, dtype=torch.bool, device=x.device).tril(-1 if strict else 0)
        d = (gi.unsqueeze(-2) - G[..., None, r0:r1, :]).masked_fill(~keep.unsqueeze(-1), float("-inf"))
        square = (xi.unsqueeze(-2) * y[..., None, r0:r1, :] * torch.exp(d)).sum(-1)
        parts = [square, x.new_zeros(*square.shape[:-1], c - r1)]
        if r0:
            ref = G[..., r0 - 1:r0, :]
            left = y[..., :r0, :] * torch.exp(ref - G[..., :r0, :])
            parts.insert(0, (xi * torch.exp(gi - ref)) @ left.transpose(-1, -2))
        rows.append(torch.cat(parts, -1))
    return torch.cat(rows, -2)


def chunk_scan(inputs: Chunks, write: Write, scale: float, k_dim: int, v_dim: int,
               initial_state: torch.Tensor | None, output_final_state: bool,
               cu_seqlens: torch.Tensor | None, chunk_size: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Evaluate ``S_t = Diag(exp(g_t)) S_{t-1} + k_t u_t^T``, ``o_t = scale S_t^T q_t`` chunk by chunk.

    inputs: name -> ``[B, T, H, ...]`` in the compute dtype; must hold q, k ``[B, T, H, K]``,
    v ``[B, T, H, V]`` and g ``[B, T, H, K]``, plus whatever ``write`` reads. For each sequence the
    inputs are cut into chunks (``[H, Nc, C, ...]``, see ``to_chunks``) and
    ``write(chunks, G) -> (Wv [H, Nc, C, V], Wk [H, Nc, C, K] or None)`` gives the written values
    ``U = Wv - Wk S0`` of every chunk from its entry state S0 (``None`` for ``Wk = 0``).
    The state starts at ``initial_state[n]`` (``[N, H, K, V]``) or 0.
    Returns ``o [B, T, H, V]`` and, if asked, the final states ``[N, H, K, V]``.
    """
    first = inputs["q"]
    batch, length, heads = first.shape[:3]
    spans = sequence_spans(cu_seqlens, batch, length)
    if initial_state is not None:
        check_state("initial_state", initial_state, len(spans), heads, k_dim, v_dim)
    rows, finals = [[] for _ in range(batch)], []
    for n, (b, start, end) in enumerate(spans):
        if initial_state is None:
            state = first.new_zeros(heads, k_dim, v_dim)
        else:
            state = initial_state[n].to(first.dtype)
        if end > start:
            x = {name: to_chunks(t[b, start:end], chunk_size) for name, t in inputs.items()}
            o, state = _chunk_pass(x, write, scale, state)
            rows[b].append(o[:end - start])
        finals.append(state)
    out = torch.stack([torch.cat(r) if r else first.new_zeros(0, heads, v_dim) for r in rows])
    return out, (torch.stack(finals) if output_final_state else None)


def _chunk_pass(x: Chunks, write: Write, scale: float, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence in chunks ``[H, Nc, C, ...]`` from the state ``[H, K, V]``: returns
    ``(o [Nc * C, H, V], final state [H, K, V])``. The chunk algebra is in the module docstring."""
    q, k, G = x["q"], x["k"], x["g"].cumsum(-2)
    g_last = G[..., -1:, :]                                          # [H, Nc, 1, K]
    a_qk = scale * decayed_gram(q, k, G, strict=False)               # [H, Nc, C, C]
    q_in = scale * q * torch.exp(G)                                  # reads S0
    k_out = k * torch.exp(g_last - G)                                # writes S_end
    carry = torch.exp(g_last).transpose(-1, -2)                      # [H, Nc, K, 1]
    w_v, w_k = write(x, G)
    outs = []
    for c in range(q.shape[1]):
        u = w_v[:, c] if w_k is None else w_v[:, c] - w_k[:, c] @ state
        outs.append(q_in[:, c] @ state + a_qk[:, c] @ u)
        state = carry[:, c] * state + k_out[:, c].transpose(-1, -2) @ u
    return torch.cat(outs, 1).transpose(0, 1), state
