"""Public ``kda_gate`` and ``kda``: the contract signature, input checks once, autograd Functions.

The checks are the contract's own (``references.contract``, ``references.kda.check_kda_inputs``) plus
what the kernels need: fp32/bf16/fp16 tensors on one device, head dims up to 256, a float32 initial
state. Tokens are flattened to ``[B*T, H, D]``; a batch without ``cu_seqlens`` is handled as B packed
sequences of T tokens, so every kernel sees one layout.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch

from refcheck.references.contract import check_scale, check_shape, check_tensor
from refcheck.references.kda import check_kda_inputs

from ..chunk.prepared import PreparedKeys
from ..chunk.scaled import Stored, row_scaled
from ..chunk.segments import Segments, Transitions, check_segment_chunks, plan
from ..chunk.state import sequence_groups
from ..chunk.tiles import cumulative_gate_dtype
from ..common import Chunks, SideStream, check_flag, check_precision, check_runs_on, kernel_state, make_chunks
from .chunk_bwd import dstate, dstate_outputs, grads
from .chunk_fwd import CHUNK, below_kernel, intra, recurrence, recurrence_outputs
from .front import front
from .gate import gate_backward, gate_cumsum, gate_forward_kernel
from .l2norm import l2norm_backward

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_HEAD_DIM = 256
DEFAULT_PRECISION = "tf32"


def _check_lower_bound(lower_bound) -> None:
    if lower_bound is not None and (isinstance(lower_bound, bool) or not isinstance(lower_bound, (int, float))
                                    or not (math.isfinite(lower_bound) and lower_bound < 0)):
        raise ValueError(f"lower_bound: expected a finite negative number, got {lower_bound!r}")


def _check_gate_params(A_log, dt_bias, H: int, K: int, device) -> None:
    check_tensor("A_log", A_log, 1, KERNEL_DTYPES)
    check_shape("A_log", A_log, (H,), "[H]")
    if dt_bias is not None:
        check_tensor("dt_bias", dt_bias, 1, KERNEL_DTYPES)
        check_shape("dt_bias", dt_bias, (H * K,), "[H*K]")
    for name, x in (("A_log", A_log), ("dt_bias", dt_bias)):
        if x is not None and x.device != device:
            raise ValueError(f"{name}: expected a tensor on {device}, got {x.device}")


# ------------------------------------------------------------------------------------------ gate


class KdaGateFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, g, A_log, dt_bias, lower_bound):
        B, T, H, K = g.shape
        flat = g.reshape(B * T, H, K).contiguous()
        chunks = make_chunks(1, B * T, None, CHUNK, g.device)
        gate = gate_cumsum(flat, A_log.contiguous(), None if dt_bias is None else dt_bias.contiguous(),
                           lower_bound, chunks, cumsum=False)
        ctx.save_for_backward(flat, A_log, dt_bias)
        ctx.lower_bound = lower_bound
        return gate.view(B, T, H, K)

    @staticmethod
    def backward(ctx, dgate):
        flat, A_log, dt_bias = ctx.saved_tensors
        dg, da, ddt = gate_backward(dgate.reshape(flat.shape).contiguous(), flat, A_log.contiguous(),
                                    None if dt_bias is None else dt_bias.contiguous(), ctx.lower_bound)
        return (dg.view(dgate.shape), da.to(A_log.dtype), None if ddt is None else ddt.to(dt_bias.dtype), None)


def kda_gate(g: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor | None = None,
             lower_bound: float | None = None) -> torch.Tensor:
    """The KDA log-decay (``references.gates``), float32 ``[B, T, H, K]``; differentiable in g,
    A_log and dt_bias. g may be fp32, bf16 or fp16: it is converted in registers, never copied."""
    check_tensor("g", g, 4, KERNEL_DTYPES)
    check_runs_on("g", g, gate_forward_kernel)
    _, _, H, K = g.shape
    _check_gate_params(A_log, dt_bias, H, K, g.device)
    _check_lower_bound(lower_bound)
    return KdaGateFunction.apply(g, A_log, dt_bias, None if lower_bound is None else float(lower_bound))


# ------------------------------------------------------------------------------------------- kda


@dataclass(frozen=True)
class KdaConfig:
    """Everything about a kda call that is not a differentiable tensor."""

    chunks: Chunks
    scale: float
    safe_gate: bool
    lower_bound: float | None
    use_gate: bool
    l2norm: bool
    precision: str
    use_gather: bool
    keep: bool
    final: bool
    segments: Segments | None


class KdaFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, beta, A_log, dt_bias, h0, cfg: KdaConfig):
        B, T, H, K = q.shape
        V = v.shape[-1]
        q, k, v, g = (x.reshape(B * T, H, x.shape[-1]).contiguous() for x in (q, k, v, g))
        beta = beta.reshape(B * T, H).contiguous()
        # the output formed in the serial pass (``chunk_fwd.recurrence``'s ``output``), its state term's left operand
        # ``q e^G`` prepared by the front (``front``: with q and k normalized and the pass's other operands); kept for
        # the backward (``disable_recompute``), the states and U fp32 (else recomputed there)
        gate_args: tuple[torch.Tensor | None, torch.Tensor | None, float | None] = (
            (A_log, dt_bias, cfg.lower_bound) if cfg.use_gate else (None, None, None))
        # G in the front (fp32 for 16-bit q, without the gate's function), else by the gate's kernel
        G = (None if cumulative_gate_dtype(q.dtype) == torch.float32 and not cfg.use_gate else
             gate_cumsum(g, *gate_args, cfg.chunks, dtype=cumulative_gate_dtype(q.dtype)))
        qn, kn, keys, G, flags = front(q, k, g, cfg.l2norm, cfg.chunks, cfg.precision, cfg.safe_gate, G=G)
        Tm, P = intra(qn, kn, G, beta, cfg.chunks, cfg.scale, flags, cfg.precision, unit_rows=cfg.l2norm)
        o = torch.empty_like(v)
        ht, hs, U, trans = recurrence(keys, v, G, beta, Tm, h0, cfg.chunks, cfg.precision, final=cfg.final,
                                      segments=cfg.segments, output=(P, o, cfg.scale), states=cfg.keep)
        kept = (hs.data, U.data) if cfg.keep else ()  # fp32, not row-scaled
        # kept: the front's prepared operands, the backward's own (``prepare_keys`` of qn, kn and G, bitwise), three
        # [T, H, K] (fp16 under "tf32") that spare it their preparation (0.28 ms at B=8, T=4096, H=16, K=V=128 on an
        # H200); over segments, each one's map and entry state (a few MB): the backward's passes skip finding them
        ctx.save_for_backward(q, k, qn, kn, v, g, beta, A_log, dt_bias, h0, G, Tm.data, Tm.scales, P, flags, *keys,
                              *kept, *(trans or ()))
        ctx.cfg = cfg
        ctx.shape = (B, T)
        return o.view(B, T, H, V), ht

    @staticmethod
    def backward(ctx, do, dht):
        cfg: KdaConfig = ctx.cfg
        q, k, qn, kn, v, g, beta, A_log, dt_bias, h0, G, Td, Ts, P, flags, *rest = ctx.saved_tensors
        keys, rest = PreparedKeys(*rest[:len(PreparedKeys._fields)]), rest[len(PreparedKeys._fields):]
        kept, trans = rest[:2] if cfg.keep else (), Transitions(*rest[-2:]) if cfg.segments is not None else None
        B, T = ctx.shape
        wide = torch.float32 if cfg.l2norm else None
        dq, dk, dv, dg, dbeta, dA, ddt, dh0 = chunk_backward(
            Saved(qn, kn, v, g, G, beta, A_log, dt_bias, h0, Stored(Td, Ts, Td.shape[-1]), P, flags, keys, kept,
                  trans), do.reshape(v.shape), dht, cfg, wide or q.dtype, wide or k.dtype)
        if cfg.l2norm:
            dq, dk = l2norm_backward(q, dq), l2norm_backward(k, dk)
        unflat = lambda x: x.view(B, T, *x.shape[1:])  # noqa: E731
        return (unflat(dq), unflat(dk), unflat(dv), unflat(dg), unflat(dbeta),
                None if dA is None else dA.to(A_log.dtype), None if ddt is None else ddt.to(dt_bias.dtype),
                dh0, None)


class Saved(NamedTuple):
    """What the chunked forward keeps for ``chunk_backward`` (tokens flattened, ``[T, H, *]``): q and k as its kernels
    read them (normalized, or as given), v, the log-decay g as given (read by the gate's backward only), the cumulative
    gate G ``[T, H, K]``, beta, the gate's parameters (or None), the initial state (or None), ``intra``'s T and P, the
    front's flags and prepared operands, with ``disable_recompute`` the states and U (else empty), and over segments
    their transitions (else None). Gated DeltaNet's: G ``[T, H]`` (one decay per head), q, k and the prepared operands
    with fewer heads than v (grouped value heads, ``chunk.tiles.key_head``)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    G: torch.Tensor
    beta: torch.Tensor
    A_log: torch.Tensor | None
    dt_bias: torch.Tensor | None
    h0: torch.Tensor | None
    T: Stored
    P: torch.Tensor
    flags: torch.Tensor | None
    keys: PreparedKeys
    kept: tuple
    transitions: Transitions | None


def chunk_backward(saved: Saved, do, dht, cfg: KdaConfig, dq_dtype: torch.dtype, dk_dtype: torch.dtype):
    """The chunked delta rule's backward from the forward's ``Saved``, given ``dO [T, H, V]`` and ``dS1`` (or None):
    ``(dq, dk, dv, dg, dbeta, dA_log, ddt_bias, dh0)``, dq and dk with respect to ``saved.q`` and ``saved.k`` in the
    dtypes given, dg with respect to g (``cfg.use_gate``: through the gate's function; else the per-channel log-decay
    whose chunk-local cumulative sum G is; with a ``[T, H]`` G the ``[T, H]`` log-decay, fp32), dq and dk per value
    head. KDA's, and Gated DeltaNet's (``optimized.gated_delta_rule.chunk``)."""
    qn, kn, v, g, G, beta, A_log, dt_bias, h0, Tm, P, flags, keys, kept, trans = saved
    do = do.contiguous()
    scaled = row_scaled(cfg.precision) and not cfg.keep  # the kept h and U are fp32: dh and dY alike
    # the recomputed states and U (a forward pass) on a stream beside the reverse pass, which does not read them:
    # where the sequences differ in length, one pass's tail runs beside the other's (H200, varlen 8.514 -> 8.156
    # ms; B=8 7.610 -> 7.594, at 834fa01)
    dht = None if dht is None else dht.contiguous()
    groups = None if cfg.keep or cfg.segments is not None else sequence_groups(cfg.chunks)
    parts: tuple  # (the sequences, or None for all; a wait for their passes) in the order their gradients run
    if groups is None:
        side = SideStream(qn.device)
        if cfg.keep:
            hs, U = (Stored(x) for x in kept)
        else:
            with side:
                _, hs, U, _ = recurrence(keys, v, G, beta, Tm, h0, cfg.chunks, cfg.precision, final=False,
                                         scaled=scaled, segments=cfg.segments, transitions=trans)
        dh, dY, dh0 = dstate(keys, G, beta, Tm, P, do, dht, cfg.chunks, cfg.scale, cfg.precision,
                             want_dh0=h0 is not None, scaled=scaled, segments=cfg.segments, transitions=trans)
        parts = ((None, lambda: side.join(hs, U)),)
    else:
        # by sequence groups (``chunk.state.sequence_groups``): the long sequences' two passes and the short ones'
        # recomputation each on a stream of its own, the short ones' reverse pass on this one; the short ones'
        # gradients once their passes are done, while the long ones' go on, then the long ones'
        long, short = groups
        hs, U, _ = recurrence_outputs(keys, v, cfg.chunks, scaled)
        dh, dY, dh0 = dstate_outputs(keys, do, cfg.chunks, scaled, h0 is not None)
        lanes = [SideStream(qn.device, lane) for lane in range(3)]
        for lane, select in zip(lanes[:2], (long, short)):
            with lane:
                recurrence(keys, v, G, beta, Tm, h0, cfg.chunks, cfg.precision, final=False, scaled=scaled,
                           select=select, stored=(hs, U, None))
        with lanes[2]:
            dstate(keys, G, beta, Tm, P, do, dht, cfg.chunks, cfg.scale, cfg.precision, want_dh0=h0 is not None,
                   scaled=scaled, select=long, stored=(dh, dY, dh0))
        dstate(keys, G, beta, Tm, P, do, dht, cfg.chunks, cfg.scale, cfg.precision, want_dh0=h0 is not None,
               scaled=scaled, select=short, stored=(dh, dY, dh0))

        def long_passes_done():
            lanes[0].join(hs, U)
            lanes[2].join(dh, dY, dh0)
        parts = ((short, lambda: lanes[1].join(hs, U)), (long, long_passes_done))
    dq, dk, dv, dg, dbeta, dA, ddt = grads(
        qn, kn, v, g, G, beta, hs, dh, U, dY, do, A_log if cfg.use_gate else None, dt_bias,
        cfg.lower_bound if cfg.use_gate else None, cfg.chunks, cfg.scale, flags, cfg.use_gather,
        cfg.precision, dq_dtype, dk_dtype, parts=parts)
    return dq, dk, dv, dg, dbeta, dA, ddt, dh0


def kda(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
        use_qk_l2norm=False, safe_gate=False, lower_bound=None, use_gate_in_kernel=False, A_log=None, dt_bias=None,
        precision=DEFAULT_PRECISION, use_gather=False, disable_recompute=False, segment_chunks=None):
    """Chunked KDA (chunk 64, sub-chunks 16): ``(o [B, T, H, V] in q.dtype, final_state fp32 or None)``.

    The contract of ``references.kda``, plus knobs:
      precision:  input precision of every fp32 ``tl.dot`` ("ieee", "tf32", "tf32x3"). Default
                  "tf32": the tensor-core rate that Hopper needs here, with errors (~1e-3 relative)
                  below the bf16/fp16 rounding of the inputs and outputs that the kernel mostly
                  serves; ask for "tf32x3" (or "ieee") for fp32 accuracy.
      use_gather: the backward's pair sums read a chunk's rows at other rows (sub-chunk reference
                  rows) with ``tl.gather`` from registers (True) or by loading them again (False, the
                  default: the loads hit L1/L2 and were faster on an H200, e.g. the forward's former
                  intra-chunk kernel 3.21 vs 3.37 ms). The forward always loads them.
      disable_recompute: keep the forward's chunk states ``h [NC, H, K, V]`` and U for the backward
                  instead of recomputing them there by a second pass of the state recurrence (fp32:
                  as much memory as bf16 q, k, v and g together at K = V; saves the pass, about
                  0.6 ms at B=8, T=4096, H=16, K=V=128 on an H200). The WY factors T and Aqk
                  (``[T, H, 64]`` each; under "tf32" T row-scaled fp16, Aqk fp16 with use_qk_l2norm, else
                  fp32: ``chunk_fwd.intra``) are always kept: recomputing them cost as much as the forward's
                  intra-chunk kernel (0.9 ms there) for half the memory of the inputs; and the serial passes'
                  operands ``k e^G``, ``k e^{G_last - G}``, ``q e^G`` (``[T, H, K]`` each, fp16 under "tf32",
                  with their row scales): preparing them again took 0.28 ms there.
      segment_chunks: the serial state passes run each sequence in segments of this many chunks side by
                  side (``chunk.segments``: each segment's transition, a scan over them, then each segment
                  from its entry state; the backward reuses the forward's transitions and entry states).
                  None (the default): chosen from the shape, where the sequences
                  are too few to fill an H100 (``segment_length``; e.g. B=1, T=32768, H=16: segments of
                  64 chunks); 0: never. Where no sequence is longer than one segment, nothing is split.
    Differentiable in q, k, v, g, beta, initial_state, and A_log / dt_bias with use_gate_in_kernel.
    """
    check_kda_inputs(q, k, v, g, beta, safe_gate=safe_gate, lower_bound=lower_bound,
                     use_gate_in_kernel=use_gate_in_kernel, A_log=A_log, dt_bias=dt_bias)
    for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        check_tensor(name, x, x.ndim, KERNEL_DTYPES)
        if x.device != q.device:
            raise ValueError(f"{name}: expected a tensor on {q.device} like q, got {x.device}")
    check_runs_on("q", q, below_kernel)
    B, T, H, K = q.shape
    V = v.shape[-1]
    for name, d in (("q", K), ("v", V)):
        if not 1 <= d <= MAX_HEAD_DIM:
            raise ValueError(f"{name}: head dim must be in [1, {MAX_HEAD_DIM}], got {d}")
    scale = check_scale(scale, K)
    for name, flag in (("output_final_state", output_final_state), ("use_qk_l2norm", use_qk_l2norm),
                       ("safe_gate", safe_gate), ("use_gate_in_kernel", use_gate_in_kernel),
                       ("use_gather", use_gather), ("disable_recompute", disable_recompute)):
        check_flag(name, flag)
    precision = check_precision(precision)
    if use_gate_in_kernel:
        _check_gate_params(A_log, dt_bias, H, K, q.device)
        _check_lower_bound(lower_bound)
    check_segment_chunks(segment_chunks)
    chunks = make_chunks(B, T, cu_seqlens, CHUNK, q.device)  # validates cu_seqlens
    initial_state = kernel_state(initial_state, chunks.num_seqs, H, K, V, q.device)
    cfg = KdaConfig(chunks, scale, safe_gate, None if lower_bound is None else float(lower_bound), use_gate_in_kernel,
                    use_qk_l2norm, precision, use_gather, disable_recompute, output_final_state,
                    plan(chunks, H, V, segment_chunks))
    if use_gate_in_kernel:
        A_log = A_log.contiguous()
        dt_bias = None if dt_bias is None else dt_bias.contiguous()
    return KdaFunction.apply(q, k, v, g, beta, A_log, dt_bias, initial_state, cfg)
