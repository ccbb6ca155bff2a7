"""Chunked evaluation of the gated linear-attention recurrences (GLA, simple GLA, KDA).

Per sequence and head these ops share one recurrence: with a log-decay ``g_t [K]`` and a written
value ``u_t [V]``,

    S_t = Diag(exp(g_t)) S_{t-1} + k_t u_t^T,        o_t = scale * S_t^T q_t

(GLA writes ``u_t = v_t``; KDA writes the delta-rule correction, see ``kda.delta_rule_write``).
Cut a sequence into chunks of C steps. In a chunk that starts from the state ``S0 [K, V]``, with the
in-chunk cumulative log-decay ``G_i = sum_{t<=i} g_t`` (rows of ``G [C, K]``, i = 0..C-1):

    S_i = Diag(exp(G_i)) S0 + sum_{j<=i} Diag(exp(G_i - G_j)) k_j u_j^T

so that, with the chunk's rows ``Q, Kc [C, K]`` and ``U [C, V]``:

    O     = scale * (Q * exp(G)) S0 + scale * Aqk U,     Aqk[i, j] = sum_k Q_ik Kc_jk exp(G_ik - G_jk), j <= i
    S_end = Diag(exp(G_last)) S0 + (Kc * exp(G_last - G))^T U

The written values are affine in the entry state, ``U = Wv - Wk S0`` (GLA: ``Wv = V``, ``Wk = 0``).
A sequence costs one such chunk step per C tokens instead of one recurrence step per token.

Numerics: log-decays may be as steep as ``g = -1000`` per step. ``exp`` is only taken of sums of
log-decays over a range of steps (``<= 0`` when ``g <= 0``), and each such sum is accumulated from
its own start (a cumulative sum), never formed as a difference ``G_i - G_j`` of two large sums;
above the diagonal the exponent is masked to ``-inf`` before ``exp``, never after.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from .recurrence import over_sequences

# Rows of a chunk whose decays are taken pair by pair (see ``pair_decays``): with C-step chunks,
# ``exp`` is evaluated about C * (SUB_CHUNK + C / SUB_CHUNK) * K times per chunk and head.
SUB_CHUNK = 8


class PairDecays(NamedTuple):
    """``exp(G_i - G_j)`` for ``j <= i`` in a chunk of C steps, split by row blocks of s = SUB_CHUNK.

    Block b holds the rows ``b*s .. b*s + s - 1`` (the chunk is zero-padded to ``nb * s`` steps) and
    its reference row is ``r_b = b*s - 1``. For j in block b ``exp(G_i - G_j) = square``; for
    ``j <= r_b < i``, ``exp(G_i - G_j) = exp(G_i - G_r) exp(G_r - G_j) = rows[b, i] cols[b, j]``.
    """
    square: torch.Tensor  # [..., nb, s, s, K]  exp(sum_{j<t<=i} g_t) for i, j in block b, 0 for j > i
    rows: torch.Tensor    # [..., nb, s, K]     exp(sum_{r_b<t<=i} g_t)
    cols: torch.Tensor    # [..., nb, nb*s, K]  exp(sum_{j<t<=r_b} g_t) for j <= r_b, 0 for j > r_b


Write = Callable[[dict[str, torch.Tensor], torch.Tensor, PairDecays], tuple[torch.Tensor, torch.Tensor | None]]


def check_chunk_size(chunk_size) -> int:
    """The number of steps per chunk: a positive int."""
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size: expected a positive int, got {chunk_size!r}")
    return chunk_size


def pad_steps(x: torch.Tensor, steps: int, dim: int) -> torch.Tensor:
    """Append zeros along ``dim`` up to ``steps`` entries."""
    missing = steps - x.shape[dim]
    if not missing:
        return x
    shape = list(x.shape)
    shape[dim] = missing
    return torch.cat([x, x.new_zeros(shape)], dim)


def sums_after(g: torch.Tensor) -> torch.Tensor:
    """``sum_{t > j} g_t`` along dim -2 (``[..., C, K]``), accumulated backwards from the end."""
    shifted = pad_steps(g[..., 1:, :], g.shape[-2], -2)
    return shifted.flip(-2).cumsum(-2).flip(-2)


def pair_decays(g: torch.Tensor) -> PairDecays:
    """The factors of ``exp(G_i - G_j)``, ``j <= i``, for the log-decays ``g [..., C, K]`` of a chunk."""
    s = SUB_CHUNK
    nb = -(-g.shape[-2] // s)
    g = pad_steps(g, nb * s, -2)
    gb = g.unflatten(-2, (nb, s))                                           # [..., nb, s, K]
    ones = torch.ones(s, s, dtype=torch.bool, device=g.device)
    # square[i, j] sums g_t over j < t <= i: a cumulative sum down i of g_t masked to t > j.
    within = gb.unsqueeze(-2).masked_fill(~ones.tril(-1).unsqueeze(-1), 0).cumsum(-3)
    square = torch.exp(within.masked_fill(~ones.tril().unsqueeze(-1), float("-inf")))
    rows = torch.exp(gb.cumsum(-2))
    # cols[b, j] sums g_t over j < t < b*s: sums_after of g masked to the steps before block b.
    t = torch.arange(nb * s, device=g.device)
    before = (t < s * torch.arange(nb, device=g.device).unsqueeze(-1)).unsqueeze(-1)  # [nb, nb*s, 1]
    upto = sums_after(g.unsqueeze(-3).masked_fill(~before, 0))
    cols = torch.exp(upto.masked_fill(~before, float("-inf")))
    return PairDecays(square, rows, cols)


def decayed_gram(x: torch.Tensor, y: torch.Tensor, decays: PairDecays) -> torch.Tensor:
    """``P[..., i, j] = sum_k x_ik y_jk exp(G_ik - G_jk)`` for ``j <= i``, 0 above the diagonal.

    x, y: ``[..., C, K]``; decays from ``pair_decays`` of the chunk's g -> P ``[..., C, C]``. Inside a
    block the products are taken pair by pair; left of it, through the block's reference row, one
    matrix product per block.
    """
    c = x.shape[-2]
    nb, s = decays.rows.shape[-3:-1]
    x, y = pad_steps(x, nb * s, -2), pad_steps(y, nb * s, -2)
    xb, yb = x.unflatten(-2, (nb, s)), y.unflatten(-2, (nb, s))
    square = (xb.unsqueeze(-2) * yb.unsqueeze(-3) * decays.square).sum(-1)       # [..., nb, s, s]
    left = (xb * decays.rows) @ (y.unsqueeze(-3) * decays.cols).transpose(-1, -2)  # [..., nb, s, nb*s]
    eye = torch.eye(nb, dtype=x.dtype, device=x.device)
    gram = left + torch.einsum("...bij,bc->...bicj", square, eye).flatten(-2)
    return gram.flatten(-3, -2)[..., :c, :c]


def differenced_pair_decays(G: torch.Tensor) -> PairDecays:
    """The factors of ``pair_decays``, formed the way chunked kernels form them: ``exp`` of
    differences ``G_i - G_j`` of the chunk's cumulative log-decay ``G [..., C, K]`` (masked to
    ``-inf`` above the diagonal before ``exp``). In a dtype of p mantissa bits a difference carries
    an absolute error ~ ``|G| 2^-p``, so with steep decays (``|G|`` in the thousands) the decays lose
    precision that ``pair_decays`` keeps: the cancellation of real chunked kernels, which the naive
    chunked yardstick (``naive_chunked``) must share to judge them fairly."""
    s = SUB_CHUNK
    nb = -(-G.shape[-2] // s)
    # pad by repeating the last row (a step of decay 1): every exponent below stays <= 0, so no
    # padded entry overflows (an inf there would turn into NaN gradients through 0 * inf)
    G = torch.cat([G, G[..., -1:, :].expand(*G.shape[:-2], nb * s - G.shape[-2], G.shape[-1])], -2)
    Gb = G.unflatten(-2, (nb, s))                                            # [..., nb, s, K]
    ones = torch.ones(s, s, dtype=torch.bool, device=G.device)
    square = torch.exp((Gb.unsqueeze(-2) - Gb.unsqueeze(-3)).masked_fill(~ones.tril().unsqueeze(-1), float("-inf")))
    ref = torch.cat([torch.zeros_like(G[..., :1, :]), G[..., s - 1:-1:s, :]], -2)  # G at r_b = b*s - 1 (G_-1 = 0)
    rows = torch.exp(Gb - ref.unsqueeze(-2))
    t = torch.arange(nb * s, device=G.device)
    before = (t < s * torch.arange(nb, device=G.device).unsqueeze(-1)).unsqueeze(-1)  # [nb, nb*s, 1]
    cols = torch.exp((ref.unsqueeze(-2) - G.unsqueeze(-3)).masked_fill(~before, float("-inf")))
    return PairDecays(square, rows, cols)


DECAY_FORMS = ("stable", "differenced")
"""How a chunk's decays are formed: ``stable`` (``pair_decays``: every exponent a sum of log-decays
from its own start; the float64 truth) or ``differenced`` (``differenced_pair_decays``: differences
of the cumulative log-decay, as kernels do; the naive chunked yardstick)."""


def check_decay_form(decays) -> str:
    if decays not in DECAY_FORMS:
        raise ValueError(f"decays: expected one of {DECAY_FORMS}, got {decays!r}")
    return decays


def chunk_step(state: torch.Tensor, x: dict[str, torch.Tensor], write: Write,
               scale: float, decay_form: str = "stable") -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk of the module docstring's algebra, for all heads at once.

    state ``[H, K, V]`` (S0); x: the chunk's q, k, g ``[H, C, K]``, v ``[H, C, V]`` and what ``write``
    reads; ``write(x, G, decays) -> (Wv [H, C, V], Wk [H, C, K] or None)`` gives ``U = Wv - Wk S0``;
    ``decay_form``: see ``DECAY_FORMS``. Returns ``(S_end [H, K, V], O [H, C, V])``.
    """
    q, k, g = x["q"], x["k"], x["g"]
    G = g.cumsum(-2)
    if decay_form == "stable":
        decays, after = pair_decays(g), torch.exp(sums_after(g))
    else:
        decays, after = differenced_pair_decays(G), torch.exp(G[..., -1:, :] - G)
    w_v, w_k = write(x, G, decays)
    u = w_v if w_k is None else w_v - w_k @ state
    o = scale * ((q * torch.exp(G)) @ state + decayed_gram(q, k, decays) @ u)
    carry = torch.exp(G[..., -1, :]).unsqueeze(-1)
    state = carry * state + (k * after).transpose(-1, -2) @ u
    return state, o


def to_chunks(x: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """``[L, H, ...]`` -> ``[ceil(L / C), H, C, ...]``, zero-padded after the last step.

    Zero padding is exact for every operand: a padded step has ``g = 0`` (decay 1), ``k = 0`` and
    ``beta = 0``, so it leaves the state unchanged; its outputs are dropped.
    """
    n = -(-x.shape[0] // chunk_size)
    return pad_steps(x, n * chunk_size, 0).unflatten(0, (n, chunk_size)).movedim(2, 1)


def chunk_scan(inputs: dict[str, torch.Tensor], write: Write, scale: float, k_dim: int, v_dim: int,
               initial_state: torch.Tensor | None, output_final_state: bool,
               cu_seqlens: torch.Tensor | None, chunk_size: int,
               decays: str = "stable", **pool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run ``chunk_step`` over the chunks of each sequence (decays formed as ``decays`` says).

    inputs: name -> ``[B, T, H, ...]`` in the compute dtype, holding q, k, g ``[B, T, H, K]``,
    v ``[B, T, H, V]`` and whatever ``write`` reads. The state starts at ``initial_state[n]``
    (``[N, H, K, V]``) or 0. Returns ``o [B, T, H, V]`` and, if asked, the final states ``[N, H, K, V]``.
    ``pool``: ``recurrence.over_sequences``' state pool keywords.
    """
    check_decay_form(decays)

    def run_sequence(state, seq):
        length = next(iter(seq.values())).shape[0]
        # unbind, not indexing: its backward assembles the gradient once, not once per chunk.
        chunks = {name: to_chunks(x, chunk_size).unbind(0) for name, x in seq.items()}
        outs = [state.new_zeros(0, state.shape[0], v_dim)]
        for values in zip(*chunks.values()):
            state, o = chunk_step(state, dict(zip(chunks, values)), write, scale, decays)
            outs.append(o.transpose(0, 1))
        return state, torch.cat(outs)[:length]

    return over_sequences(run_sequence, inputs, k_dim, v_dim, initial_state, output_final_state, cu_seqlens, **pool)
