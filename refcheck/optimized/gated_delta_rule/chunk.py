"""Public ``gated_delta_rule_chunk``: chunked Gated DeltaNet, forward and backward, on KDA's kernels.

Gated DeltaNet is KDA with one decay per value head: ``g [B, T, HV]`` is KDA's gate constant over the K channels. So
the op runs KDA's chunked machinery (``optimized.kda``: the intra-chunk WY factors, the serial pass with the output,
segments), with the gate as it is, ``[T, HV]``, and where a constant decay makes the work smaller, smaller:

* the chunk-local cumulative gate G ``[T, HV]`` is ``gate.gate_cumsum`` of g seen as ``[T, HV, 1]`` (KDA's gate with
  K = 1: ``-exp(A_log) softplus(a + dt_bias)`` with ``use_gate_in_kernel``), fp64 for fp32 inputs as KDA's;
* the front (``front.scalar_front``) normalizes q and k once per query/key head and forms no decayed operands: the
  serial pass reads q and k under the row scales ``e^G`` and ``e^{G_last - G}``;
* the intra-chunk blocks leave the decay out of their sums: ``A_ij = (k_i . k_j) e^{G_i - G_j}``, plain dots weighed
  afterwards by factors in (0, 1], for any decay, where KDA's per-channel decay needs reference rows and, beyond
  their span, exact rows (``blocks.diag_block``, ``blocks.below_scalar``);
* grouped value heads read their query/key head ``j // (HV / H)`` in place (``tiles.key_head``): nothing is copied
  per value head;
* the serial pass reads ``e^{G_last}`` as one number a head (``state.block_gammas``).

The backward is KDA's (``kda.api.chunk_backward``) on the forward's own operands: its serial passes and state terms
read G ``[T, HV]`` and q, k at their query/key heads under the row scales (the ``SCALAR`` and ``GROUP`` of
``chunk_bwd.dstate_kernel`` and ``grads_state_kernel``), and its pair sums are ``[64, 64]`` dots with the decay out of
them (``chunk_bwd.scalar_pairs_kernel``), whose dg is ``[T, HV]``; then the gate's function with
``use_gate_in_kernel`` (``gate.gate_backward``), and dq, dk (per value head) summed over each group's value heads,
then through the norm (``use_qk_l2norm``). beta's sigmoid and the
value-first state layout are taken around the kernels by PyTorch (``[T, HV]`` and ``[N, HV, K, V]`` elementwise
work); a state pool is gathered into the initial states and the final states written back into their slots.
"""
from __future__ import annotations

import torch

from refcheck.references.contract import check_state_pool

from ..chunk.prepared import PreparedKeys
from ..chunk.scaled import Stored
from ..chunk.segments import Transitions, check_segment_chunks, plan
from ..chunk.tiles import cumulative_gate_dtype
from ..common import check_precision, kernel_state, make_chunks
from ..kda.api import DEFAULT_PRECISION, KdaConfig, Saved, chunk_backward
from ..kda.chunk_fwd import CHUNK, below_kernel, intra, recurrence
from ..kda.gate import gate_backward, gate_cumsum
from ..kda.l2norm import l2norm_backward
from .api import check_call
from .front import scalar_front


class GdnChunkFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, beta, A_log, dt_bias, h0, cfg: KdaConfig, use_gate: bool):
        B, T, H, K = q.shape
        HV, V = v.shape[2], v.shape[3]
        q, k = (x.reshape(B * T, H, K).contiguous() for x in (q, k))
        v = v.reshape(B * T, HV, V).contiguous()
        g, beta = (x.reshape(B * T, HV).contiguous() for x in (g, beta))
        G = gate_cumsum(g.view(B * T, HV, 1), A_log if use_gate else None, dt_bias if use_gate else None, None,
                        cfg.chunks, dtype=cumulative_gate_dtype(q.dtype)).view(B * T, HV)
        qn, kn, keys = scalar_front(q, k, G, cfg.l2norm, cfg.chunks)
        Tm, P = intra(qn, kn, G, beta, cfg.chunks, cfg.scale, None, cfg.precision, unit_rows=cfg.l2norm)
        o = torch.empty_like(v)
        ht, _, _, trans = recurrence(keys, v, G, beta, Tm, h0, cfg.chunks, cfg.precision, final=cfg.final,
                                     segments=cfg.segments, output=(P, o, cfg.scale), states=False)
        ctx.save_for_backward(q, k, qn, kn, v, g, beta, A_log, dt_bias, h0, G, Tm.data, Tm.scales, P, keys.sg, keys.sd,
                              *(trans or ()))
        ctx.cfg, ctx.use_gate, ctx.shape = cfg, use_gate, (B, T)
        return o.view(B, T, HV, V), ht

    @staticmethod
    def backward(ctx, do, dht):
        cfg: KdaConfig = ctx.cfg
        q, k, qn, kn, v, g, beta, A_log, dt_bias, h0, G, Td, Ts, P, eg, ed, *rest = ctx.saved_tensors
        trans = Transitions(*rest) if cfg.segments is not None else None
        B, T = ctx.shape
        total, H, K = q.shape
        HV = v.shape[1]
        wide = torch.float32 if cfg.l2norm or H != HV else None
        dq, dk, dv, dgate, dbeta, _, _, dh0 = chunk_backward(
            Saved(qn, kn, v, G, G, beta, None, None, h0, Stored(Td, Ts, Td.shape[-1]), P, None,
                  PreparedKeys(kn, eg, kn, ed, qn, eg), (), trans),
            do.reshape(v.shape), dht, cfg, wide or q.dtype, wide or k.dtype)
        dA = ddt = None
        if ctx.use_gate:
            dg, dA, ddt = gate_backward(dgate.view(total, HV, 1), g.view(total, HV, 1), A_log, dt_bias, None)
            dg = dg.view(total, HV)
            dA, ddt = dA.to(A_log.dtype), None if ddt is None else ddt.to(dt_bias.dtype)
        else:
            dg = dgate.to(g.dtype)
        if H != HV:  # each query/key head's gradient: the sum over the value heads of its group
            dq, dk = (x.view(total, H, HV // H, K).sum(2) for x in (dq, dk))
        if cfg.l2norm:
            dq, dk = l2norm_backward(q, dq), l2norm_backward(k, dk)
        dq, dk = dq.to(q.dtype), dk.to(k.dtype)
        unflat = lambda x: x.view(B, T, *x.shape[1:])  # noqa: E731
        return unflat(dq), unflat(dk), unflat(dv), unflat(dg), unflat(dbeta), dA, ddt, dh0, None, None


def gated_delta_rule_chunk(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False,
                           cu_seqlens=None, use_qk_l2norm=False, use_gate_in_kernel=False, A_log=None, dt_bias=None,
                           use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, state_v_first=False,
                           ssm_state_indices=None, inplace_final_state=False, precision=DEFAULT_PRECISION,
                           segment_chunks=None):
    """Chunked Gated DeltaNet (chunk 64, sub-chunks 16; module docstring): ``(o [B, T, HV, V] in q.dtype, final_state
    float32 [N, HV, K, V] or None)`` (``[N, HV, V, K]`` with ``state_v_first``).

    The contract of ``references.gated_delta_rule``: grouped value heads (q, k ``[B, T, H, K]``; v ``[B, T, HV, V]``,
    g and beta ``[B, T, HV]``), the gate's function with ``use_gate_in_kernel`` (``A_log``, ``dt_bias [HV]``), beta's
    sigmoid, ``allow_neg_eigval``, ``state_v_first``, varlen, and a state pool (``ssm_state_indices``: sequence n
    starts from slot ``ssm_state_indices[n]`` of ``initial_state [P, HV, K, V]``; with ``inplace_final_state`` its
    final state is written back there and None returned; the slots are read back to the host to be checked).
    Knobs, as ``optimized.kda``'s: ``precision`` ("tf32" by default, "tf32x3", "ieee"), ``segment_chunks``.
    Differentiable in q, k, v, g, beta, initial_state, and A_log / dt_bias with use_gate_in_kernel.
    """
    B, T, H, K, HV, V, scale = check_call(
        below_kernel, q, k, v, g, beta, scale,
        dict(output_final_state=output_final_state, use_qk_l2norm=use_qk_l2norm, use_gate_in_kernel=use_gate_in_kernel,
             state_v_first=state_v_first, use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
             allow_neg_eigval=allow_neg_eigval, inplace_final_state=inplace_final_state),
        dict(A_log=A_log, dt_bias=dt_bias, initial_state=initial_state, ssm_state_indices=ssm_state_indices,
             cu_seqlens=cu_seqlens), one_dtype=False)
    precision = check_precision(precision)
    check_segment_chunks(segment_chunks)
    chunks = make_chunks(B, T, cu_seqlens, CHUNK, q.device)  # validates cu_seqlens
    N = chunks.num_seqs
    sk, sv = (V, K) if state_v_first else (K, V)
    pool = None
    if ssm_state_indices is not None:
        pool, _ = check_state_pool(initial_state, ssm_state_indices, N, HV, sk, sv, inplace=inplace_final_state,
                                       output_final_state=output_final_state)
        initial_state = pool[ssm_state_indices.long()]
    if state_v_first and initial_state is not None:
        initial_state = initial_state.transpose(-1, -2)
    initial_state = kernel_state(initial_state, N, HV, K, V, q.device)
    if use_beta_sigmoid_in_kernel:
        beta = beta.sigmoid() * (2 if allow_neg_eigval else 1)
    cfg = KdaConfig(chunks, scale, False, None, False, use_qk_l2norm, precision, False, False,
                    output_final_state or inplace_final_state, plan(chunks, HV, V, segment_chunks))
    o, final = GdnChunkFunction.apply(q, k, v, g, beta, A_log if use_gate_in_kernel else None,
                                      dt_bias if use_gate_in_kernel else None, initial_state, cfg, use_gate_in_kernel)
    if final is not None and state_v_first:
        final = final.transpose(-1, -2)
    if inplace_final_state:
        with torch.no_grad():
            pool[ssm_state_indices.long()] = final.to(pool.dtype)
    return o, (final if output_final_state else None)
