"""Public ``gla`` and ``simple_gla``: the contract signature, input checks once, one autograd Function.

The checks are the contract's own (``references.contract``, ``references.gla.check_gla_inputs``) plus
what the kernels need: fp32/bf16/fp16 tensors on one device, head dims up to 256, a float32 initial
state. A batch without ``cu_seqlens`` is handled as B packed sequences of T tokens, so every kernel
sees one chunk table; ``head_first=True`` reads ``[B, H, T, D]`` tensors in place (strides, no copy),
except where a head dim is 1: there the head-first rows of a tile are contiguous, the compiler
specializes the unit stride and gives the tile another register layout, and with it another order of
its reductions (``tl.cumsum`` of the gates differed by 3.8e-6 at K = 1, fp32, on an H200: the
head-first law's finding), so such a call runs sequence-first on the transposed tensors and gives
o back transposed: the sequence-first call's results, by construction. Simple GLA's head-first gate
``[B, H, T]`` has unit-stride rows whatever K is (o differed by 1.2e-5 at K = 32): its cumulative sum
reads a sequence-first copy (``[B, T, H]``, one value per token and head).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from refcheck.references.contract import check_scale, check_tensor
from refcheck.references.gla import check_gla_inputs

from ..chunk.tiles import cumulative_gate_dtype
from ..common import Chunks, check_flag, check_precision, check_runs_on, kernel_state, make_chunks
from .chunk import CHUNK_SIZES, chunk_cumsum, dstate, forward, grads, intra, intra_kernel

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_HEAD_DIM = 256
DEFAULT_PRECISION = "tf32"
EXACT_CHUNK = 64
"""The chunk size with precision "ieee", whatever ``chunk_size`` says: "ieee" dots run on the FMA units
with their operands in shared memory, and at chunk size 128 the backward's ``grads_qk_kernel`` needs 270 KB
of it (Triton 3.6, sm_90), more than an H100 has (227 KB); the GPU refused it (OutOfResources) in
``refcheck report``'s path_agreement law. The chunk size changes the speed, not the math."""


@dataclass(frozen=True)
class GlaConfig:
    """Everything about a gla / simple_gla call that is not a differentiable tensor."""

    chunks: Chunks
    scale: float
    scalar: bool        # simple GLA: g [B, T, H]
    head_first: bool
    T: int              # tokens per batch row (the head-first layout's stride unit)
    precision: str
    final: bool
    split_k: bool | None    # state passes split by K-block (None: where the grid leaves SMs idle)


class ChunkGlaFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, h0, cfg: GlaConfig):
        B = q.shape[0]
        H = q.shape[1] if cfg.head_first else q.shape[2]
        GK = 1 if cfg.scalar else q.shape[-1]
        ch = cfg.chunks
        G = torch.empty(B * cfg.T, H, GK, device=q.device, dtype=cumulative_gate_dtype(q.dtype))
        # a head-first scalar gate [B, H, T] has unit-stride rows: read sequence-first (see the module docstring)
        copy_gate = cfg.head_first and cfg.scalar
        chunk_cumsum(g.transpose(1, 2).contiguous() if copy_gate else g, G, ch, H, cfg.T, GK, parts=1,
                     x_head_first=cfg.head_first and not copy_gate, out_head_first=False, reverse=False)
        P = intra(q, k, G, ch, H, cfg.T, cfg.scale, cfg.head_first, cfg.scalar, cfg.precision)
        o, ht, hs = forward(q, k, v, G, P, h0, ch, H, cfg.T, cfg.scale, cfg.head_first, cfg.scalar, cfg.precision,
                            final=cfg.final, split_k=cfg.split_k)
        if any(ctx.needs_input_grad):
            ctx.save_for_backward(q, k, v, g, G, P, h0, hs)
        ctx.cfg = cfg
        return o, ht

    @staticmethod
    def backward(ctx, do, dht):
        cfg: GlaConfig = ctx.cfg
        q, k, v, g, G, P, h0, hs = ctx.saved_tensors
        H, V = G.shape[1], v.shape[-1]
        GK = G.shape[-1]
        ch = cfg.chunks
        do = do.contiguous()
        dh, dh0 = dstate(q, G, do, None if dht is None else dht.contiguous(), ch, H, cfg.T, V, cfg.scale,
                         cfg.head_first, cfg.scalar, cfg.precision, want_dh0=h0 is not None, split_k=cfg.split_k)
        dq, dk, dv, dG = grads(q, k, v, G, P, hs, dh, do, ch, H, cfg.T, cfg.scale, cfg.head_first, cfg.scalar,
                               cfg.precision)
        dg = chunk_cumsum(dG, torch.empty_like(g), ch, H, cfg.T, GK, parts=dG.shape[0], x_head_first=False,
                          out_head_first=cfg.head_first, reverse=True)
        return dq, dk, dv, dg, dh0, None


def _check_and_run(q, k, v, g, *, scalar, scale, initial_state, output_final_state, cu_seqlens, head_first,
                   precision, chunk_size, split_k):
    """Validate everything (a ValueError naming the argument, before any launch) and run."""
    check_flag("head_first", head_first)
    check_flag("output_final_state", output_final_state)
    if split_k is not None:
        check_flag("split_k", split_k)
    for name, x in (("q", q), ("k", k), ("v", v), ("g", g)):
        check_tensor(name, x, 3 if name == "g" and scalar else 4, KERNEL_DTYPES)
    if head_first:
        if cu_seqlens is not None:
            raise ValueError("cu_seqlens: packed sequences need the sequence-first layout, got head_first=True")
        B, H, T = q.shape[:3]
        seq_first = [x.transpose(1, 2) for x in (q, k, v, g)]  # views: the contract's checks, in its layout
    else:
        B, T, H = q.shape[:3]
        seq_first = [q, k, v, g]
    check_gla_inputs(*seq_first, scalar_gate=scalar)
    for name, x in (("k", k), ("v", v), ("g", g)):
        if x.device != q.device:
            raise ValueError(f"{name}: expected a tensor on {q.device} like q, got {x.device}")
    check_runs_on("q", q, intra_kernel)
    K, V = q.shape[-1], v.shape[-1]
    for name, d in (("q", K), ("v", V)):
        if not 1 <= d <= MAX_HEAD_DIM:
            raise ValueError(f"{name}: head dim must be in [1, {MAX_HEAD_DIM}], got {d}")
    scale = check_scale(scale, K)
    precision = check_precision(precision)
    if chunk_size not in CHUNK_SIZES or isinstance(chunk_size, bool):
        raise ValueError(f"chunk_size: expected one of {CHUNK_SIZES}, got {chunk_size!r}")
    if head_first and min(K, V) == 1:
        o, ht = _check_and_run(*(x.transpose(1, 2) for x in (q, k, v, g)), scalar=scalar, scale=scale,
                               initial_state=initial_state, output_final_state=output_final_state, cu_seqlens=None,
                               head_first=False, precision=precision, chunk_size=chunk_size, split_k=split_k)
        return o.transpose(1, 2), ht
    size = EXACT_CHUNK if precision == "ieee" else chunk_size
    chunks = make_chunks(B, T, cu_seqlens, size, q.device)  # validates cu_seqlens
    initial_state = kernel_state(initial_state, chunks.num_seqs, H, K, V, q.device)
    cfg = GlaConfig(chunks, scale, scalar, head_first, T, precision, output_final_state, split_k)
    q, k, v, g = (x.contiguous() for x in (q, k, v, g))
    return ChunkGlaFunction.apply(q, k, v, g, initial_state, cfg)


KNOBS_DOC = """
    Knobs:
      head_first: q, k, v, g and o are ``[B, H, T, D]`` (g ``[B, H, T]`` for simple GLA), read and
                  written in place; not with ``cu_seqlens``. Bitwise the same results as the
                  sequence-first call on the transposed tensors.
      precision:  input precision of every fp32 ``tl.dot`` ("ieee", "tf32", "tf32x3"); default "tf32"
                  (errors ~1e-3 relative, below the bf16/fp16 rounding of the data it mostly serves).
      chunk_size: 64 or 128 tokens per chunk (with precision "ieee" always 64, ``EXACT_CHUNK``).
      split_k:    the serial state passes run one program per 64-row block of the state's K rows
                  (True) or one per value block, sequence and head (False); None (default): split
                  only where the unsplit launch would leave SMs idle (``chunk.split_by_k_block``).
    Returns ``(o [B, T, H, V] in q.dtype, final_state [N, H, K, V] fp32 or None)``; differentiable in
    q, k, v, g and initial_state (dg in g's dtype)."""


def gla(q, k, v, g, *, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
        head_first=False, precision=DEFAULT_PRECISION, chunk_size=64, split_k=None):
    """Chunked GLA (``chunk.py``), the contract of ``references.gla``: ``g [B, T, H, K]`` log-decays
    (fp32, bf16 or fp16, converted in the kernel), ``S_t = Diag(exp(g_t)) S_{t-1} + k_t v_t^T``,
    ``o_t = scale S_t^T q_t``."""
    return _check_and_run(q, k, v, g, scalar=False, scale=scale, initial_state=initial_state,
                          output_final_state=output_final_state, cu_seqlens=cu_seqlens, head_first=head_first,
                          precision=precision, chunk_size=chunk_size, split_k=split_k)


def simple_gla(q, k, v, g, *, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
               head_first=False, precision=DEFAULT_PRECISION, chunk_size=64, split_k=None):
    """Chunked simple GLA, the contract of ``references.simple_gla``: one log-decay per head and
    token, ``g [B, T, H]``, ``S_t = exp(g_t) S_{t-1} + k_t v_t^T``, ``o_t = scale S_t^T q_t``."""
    return _check_and_run(q, k, v, g, scalar=True, scale=scale, initial_state=initial_state,
                          output_final_state=output_final_state, cu_seqlens=cu_seqlens, head_first=head_first,
                          precision=precision, chunk_size=chunk_size, split_k=split_k)


gla.__doc__ = (gla.__doc__ or "") + KNOBS_DOC
simple_gla.__doc__ = (simple_gla.__doc__ or "") + KNOBS_DOC
