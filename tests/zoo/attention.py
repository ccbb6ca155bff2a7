"""Softmax attention written from other standard formulas than the reference's, with buggy twins.

User kernels (not registered): ``--impl attention=tests.zoo.attention:NAME``. Every member has the
contract signature ``f(q, k, v, *, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None)``:

    q [B, T, H, Dqk], k [B, S, Hk, Dqk], v [B, S, Hk, Dv], H % Hk == 0 (query head h reads kv head h // (H // Hk));
    packed: B == 1 and cu_seqlens_q / cu_seqlens_k (int32/int64, as many sequences each);
    returns o [B, T, H, Dv] in q.dtype and lse [B, H, T] in float32 (natural log).

Per sequence and head, with scores ``s_ij = scale * q_i . k_j`` (scale defaults to Dqk ** -0.5) and the
causal mask aligned bottom-right (row i sees key j iff ``j <= i + S - T``):

    lse_i = log sum_j exp(s_ij),   o_i = sum_j exp(s_ij - lse_i) v_j;
    a row that sees no key has o_i = 0 and lse_i = -inf exactly (and zero gradients).

Online softmax (``_online``) walks key blocks of ``block`` keys keeping a running max ``m``, running sum
``l`` and accumulator ``acc``:

    m' = max(m, rowmax(s_blk)),  a = exp(m - m'),  P = exp(s_blk - m'),
    l' = a l + rowsum(P),        acc' = a acc + P V_blk,      o = acc / l,  lse = m + log l;

``m`` is detached: o and lse do not depend on it, so autograd differentiates the rest exactly.
Scores, P, l and acc are fp32 (q, k, v upcast); ``p_in_dtype`` rounds P to the input dtype before
``P V`` (operands in the input dtype, fp32 accumulation), as flash kernels do. The flash backward
(``_FlashAttention``) recomputes ``P = exp(s - lse)`` and, with the upstream gradients dO, dlse:

    dP = dO V^T,  D = rowsum(dO * O),  dS = P * (dP - D + dlse),
    dq = scale dS K,  dk = scale dS^T Q,  dv = P^T dO

(``dlse`` enters because lse is an output). The buggy twins change one rule (``Rules``) or drop the
rescale; their docstrings say "BUG".
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from refcheck.references.attention import check_attention_inputs
from refcheck.references.contract import check_scale

NEG_INF = float("-inf")
COMPUTE = torch.float32

Core = Callable[..., "tuple[torch.Tensor, torch.Tensor]"]
"""``core(q [H, T, Dqk], k [H, S, Dqk], v [H, S, Dv], visible [T, S] bool, scale) -> (o [H, T, Dv], lse [H, T] fp32)``."""


# --- the contract's index rules (a buggy twin breaks one) ------------------------------------------

def _bottom_right(t: int, s: int) -> int:
    return s - t


def _top_left(t: int, s: int) -> int:
    return 0


def _grouped(h: int, hk: int) -> torch.Tensor:
    return torch.arange(h) // (h // hk)


def _modulo(h: int, hk: int) -> torch.Tensor:
    return torch.arange(h) % hk


@dataclass(frozen=True)
class Rules:
    """How rows meet keys: the causal offset (row i sees key j iff j <= i + offset(T, S)), the kv head
    of each query head, whether a packed sequence also sees the key before its span, and the factor
    applied to the returned lse (1: natural log)."""

    causal_offset: Callable[[int, int], int] = _bottom_right
    kv_heads: Callable[[int, int], torch.Tensor] = _grouped
    leak_previous_key: bool = False
    lse_factor: float = 1.0


CONTRACT = Rules()


def _visible(t: int, s: int, causal: bool, offset: int, device) -> torch.Tensor:
    """``[T, S]``: whether row i sees key j."""
    if not causal:
        return torch.ones(t, s, dtype=torch.bool, device=device)
    i = torch.arange(t, device=device).unsqueeze(1)
    j = torch.arange(s, device=device).unsqueeze(0)
    return j <= i + offset


def _attention(q, k, v, causal, scale, cu_seqlens_q, cu_seqlens_k, core: Core, rules: Rules = CONTRACT):
    """Validate, split into sequences, gather each query head's kv head, run ``core`` per sequence and
    put the pieces back: o ``[B, T, H, Dv]`` in q.dtype, lse ``[B, H, T]`` fp32."""
    pairs = check_attention_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k)
    scale = check_scale(scale, q.shape[-1])
    heads = rules.kv_heads(q.shape[2], k.shape[2]).to(q.device)
    o_parts: list[list[torch.Tensor]] = [[] for _ in range(q.shape[0])]
    lse_parts: list[list[torch.Tensor]] = [[] for _ in range(q.shape[0])]
    for row, (qs, qe), (ks, ke) in pairs:
        visible = _visible(qe - qs, ke - ks, causal, rules.causal_offset(qe - qs, ke - ks), q.device)
        if rules.leak_previous_key and ks > 0:
            ks -= 1
            visible = torch.cat([visible.new_ones(qe - qs, 1), visible], dim=1)
        qi = q[row, qs:qe].transpose(0, 1)                                  # [H, T, Dqk]
        kj = k[row, ks:ke].index_select(1, heads).transpose(0, 1)           # [H, S, Dqk]
        vj = v[row, ks:ke].index_select(1, heads).transpose(0, 1)           # [H, S, Dv]
        o, lse = core(qi, kj, vj, visible, scale)
        o_parts[row].append(o.to(q.dtype).transpose(0, 1))                  # [T, H, Dv]
        lse_parts[row].append(lse.float() * rules.lse_factor)            # [H, T]
    return (torch.stack([torch.cat(p) for p in o_parts]),
            torch.stack([torch.cat(p, dim=1) for p in lse_parts]))


# --- cores ----------------------------------------------------------------------------------------

def _scores(qi, kj, visible, scale) -> torch.Tensor:
    """fp32 ``scale * q k^T`` (q, k upcast), -inf where a row does not see a key."""
    s = scale * (qi.to(COMPUTE) @ kj.to(COMPUTE).transpose(-1, -2))
    return s.masked_fill(~visible, NEG_INF)


def _online(qi, kj, vj, visible, scale, *, block: int, p_in_dtype: bool = False, rescale: bool = True):
    """Online softmax over key blocks of ``block`` (module docstring); ``rescale=False`` is the bug of
    not multiplying the accumulator by ``exp(m - m')``. At least one (possibly empty) block runs, so
    that the outputs depend on q, k, v even when S == 0 (gradients zero, not missing)."""
    h, t, s = qi.shape[0], qi.shape[1], kj.shape[1]
    m = qi.new_full((h, t), NEG_INF, dtype=COMPUTE)
    l = qi.new_zeros((h, t), dtype=COMPUTE)
    acc = qi.new_zeros((h, t, vj.shape[-1]), dtype=COMPUTE)
    for start in range(0, max(s, 1), block):
        sb = _scores(qi, kj[:, start:start + block], visible[:, start:start + block], scale)
        blk_max = sb.detach().amax(-1) if sb.shape[-1] else m
        m_new = torch.maximum(m, blk_max)
        m_safe = torch.where(torch.isfinite(m_new), m_new, 0.0)       # a row that saw no key yet
        alpha = torch.exp(m - m_safe)                                   # 0 while m = -inf
        p = torch.exp(sb - m_safe.unsqueeze(-1))
        pv = p.to(qi.dtype).to(COMPUTE) if p_in_dtype else p
        l = alpha * l + p.sum(-1)
        acc = (alpha.unsqueeze(-1) * acc if rescale else acc) + pv @ vj[:, start:start + block].to(COMPUTE)
        m = m_new
    seen = l > 0                                                        # l >= 1 on a row that saw a key
    l_safe = torch.where(seen, l, 1.0)
    lse = torch.where(seen, torch.where(seen, m, 0.0) + torch.log(l_safe), NEG_INF)
    return acc / l_safe.unsqueeze(-1), lse


def _dense(qi, kj, vj, visible, scale):
    """Textbook: fp32 scores, ``lse = logsumexp(s)``, ``o = exp(s - lse) V``, autograd through all of it
    (rows that see no key are fed zeros to logsumexp, so that its backward stays NaN-free)."""
    s = _scores(qi, kj, visible, scale)
    seen = visible.any(-1)                                              # [T]
    lse = torch.where(seen, torch.logsumexp(torch.where(seen.unsqueeze(-1), s, 0.0), -1), NEG_INF)
    p = torch.exp(s - torch.where(seen, lse, 0.0).unsqueeze(-1))
    return p @ vj.to(COMPUTE), lse


class _FlashAttention(torch.autograd.Function):
    """One sequence: forward = online softmax over key blocks of 64, saving o and lse; backward = the
    flash backward of the module docstring, P and dS rounded to the input dtype before the dots when
    ``round_p``, fp32 otherwise (accumulation fp32 in both)."""

    @staticmethod
    def forward(ctx, qi, kj, vj, visible, scale, round_p):
        o, lse = _online(qi, kj, vj, visible, scale, block=64, p_in_dtype=round_p)
        o = o.to(qi.dtype)
        ctx.save_for_backward(qi, kj, vj, visible, o, lse)
        ctx.scale, ctx.round_p = scale, round_p
        return o, lse

    @staticmethod
    def backward(ctx, do, dlse):
        qi, kj, vj, visible, o, lse = ctx.saved_tensors
        scale = ctx.scale
        rounded = (lambda x: x.to(qi.dtype).to(COMPUTE)) if ctx.round_p else (lambda x: x)
        do = torch.zeros_like(o, dtype=COMPUTE) if do is None else do.to(COMPUTE)
        dlse = torch.zeros_like(lse) if dlse is None else dlse.to(COMPUTE)
        q32, k32, v32 = qi.to(COMPUTE), kj.to(COMPUTE), vj.to(COMPUTE)
        p = torch.exp(_scores(qi, kj, visible, scale) - torch.where(torch.isfinite(lse), lse, 0.0).unsqueeze(-1))
        dp = do @ v32.transpose(-1, -2)
        d = (do * o.to(COMPUTE)).sum(-1, keepdim=True)
        ds = rounded(p * (dp - d + dlse.unsqueeze(-1)))
        dq = scale * (ds @ k32)
        dk = scale * (ds.transpose(-1, -2) @ q32)
        dv = rounded(p).transpose(-1, -2) @ do
        return dq.to(qi.dtype), dk.to(kj.dtype), dv.to(vj.dtype), None, None, None


def _flash(qi, kj, vj, visible, scale, *, round_p: bool):
    return _FlashAttention.apply(qi, kj, vj, visible, scale, round_p)


# --- correct members ------------------------------------------------------------------------------

def online_softmax_b16(q, k, v, *, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None):
    """Online softmax over key blocks of 16: m' = max(m, rowmax s), l' = e^(m-m') l + sum P,
    acc' = e^(m-m') acc + P V, o = acc / l, lse = m + log l; scores and P fp32; autograd backward."""
    return _attention(q, k, v, causal, scale, cu_seqlens_q, cu_seqlens_k, partial(_online, block=16))


def online_softmax_b128_p_input(q, k, v, *, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None):
    """Online softmax over key blocks of 128 with P rounded to the input dtype before P V (fp32
    accumulation, l summed from the fp32 P), as flash kernels do; autograd backward."""
    return _attention(q, k, v, causal, scale, cu_seqlens_q, cu_seqlens_k, partial(_online, block=128, p_in_dtype=True))


def flash_backward_fp32(q, k, v, *, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None):
    """Online-softmax forward (blocks of 64) saving o, lse; flash backward P = exp(s - lse), dP = dO V^T,
    D = rowsum(dO O), dS = P (dP - D + dlse), dq = scale dS K, dk = scale dS^T Q, dv = P^T dO, all fp32."""
    return _attention(q, k, v, causal, scale, cu_seqlens_q, cu_seqlens_k, partial(_flash, round_p=False))


def flash_backward_input_dtype(q, k, v, *, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None):
    """``flash_backward_fp32`` with P (forward and backward) and dS rounded to the input dtype before
    their dots (operands in the input dtype, fp32 accumulation), as real flash kernels do."""
    return _attention(q, k, v, causal, scale, cu_seqlens_q, cu_seqlens_k, partial(_flash, round_p=True))


def dense_textbook(q, k, v, *, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None):
    """s = scale q k^T in fp32, lse = torch.logsumexp(s), o = exp(s - lse) V (dense); autograd backward."""
    return _attention(q, k, v, causal, scale, cu_seqlens_q, cu_seqlens_k, _dense)


# --- buggy twins ----------------------------------------------------------------------------------

_B16 = partial(_online, block=16)


def bug_causal_top_left(q, k, v, *, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None):
    """BUG: the causal mask aligned top-left (row i sees key j iff j <= i), wrong whenever S != T."""
    return _attention(q, k, v, causal, scale, cu_seqlens_q, cu_seqlens_k, _B16, Rules(causal_offset=_top_left))


def bug_gqa_head_modulo(q, k, v, *, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None):
    """BUG: query head h reads kv head h % Hk instead of h // (H // Hk) (wrong when 1 < Hk < H)."""
    return _attention(q, k, v, causal, scale, cu_seqlens_q, cu_seqlens_k, _B16, Rules(kv_heads=_modulo))


def bug_varlen_key_leak(q, k, v, *, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None):
    """BUG: every packed sequence after the first also sees the key just before its span (the previous
    sequence's last key), visible to all its rows."""
    return _attention(q, k, v, causal, scale, cu_seqlens_q, cu_seqlens_k, _B16, Rules(leak_previous_key=True))


def bug_no_rescale(q, k, v, *, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None):
    """BUG: online softmax (blocks of 16) that rescales l but not the accumulator when the running max
    grows: acc' = acc + P V; wrong only where a later key block raises a row's max."""
    return _attention(q, k, v, causal, scale, cu_seqlens_q, cu_seqlens_k, partial(_online, block=16, rescale=False))


def bug_lse_log2(q, k, v, *, causal=False, scale=None, cu_seqlens_q=None, cu_seqlens_k=None):
    """BUG: lse returned in base 2, log2 sum_j exp(s_ij) = lse / ln 2 (o is right)."""
    return _attention(q, k, v, causal, scale, cu_seqlens_q, cu_seqlens_k, _B16, Rules(lse_factor=1 / math.log(2)))
