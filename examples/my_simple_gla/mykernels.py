"""Chunked simple GLA in plain PyTorch: a correct kernel in two precisions, plus four buggy variants.

Contract, per sequence and head, with state S: [K, V] and S_0 = initial_state (or zeros):

    S_t = exp(g_t) * S_{t-1} + k_t v_t^T        (g_t <= 0: one scalar log-decay per head and step)
    o_t = scale * S_t^T q_t

Every public function has the signature

    f(q, k, v, g, *, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None)
        q, k: [B, T, H, K]   v: [B, T, H, V]   g: [B, T, H]   initial_state: float32 [N, H, K, V]
        cu_seqlens: int32/int64 [N+1] offsets of packed sequences (then B == 1); else N = B
        -> o: [B, T, H, V] in q's dtype, final_state: float32 [N, H, K, V] or None

Gradients (to q, k, v, g, initial_state) come from autograd. Needs only torch.
"""
import torch

__all__ = ["chunk_simple_gla", "chunk_simple_gla_input_dtype", "bug_state_leak",
           "bug_chunk_boundary", "bug_double_scale", "bug_last_gate"]

CHUNK = 64
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def _check_inputs(q, k, v, g, initial_state, cu_seqlens):
    """Raise ValueError naming the bad argument; return the number of sequences N."""
    if q.dim() != 4 or q.dtype not in _FLOATS:
        raise ValueError(f"q must be a float32/bf16/fp16 [B, T, H, K] tensor, got {q.dtype} {tuple(q.shape)}")
    B, T, H, K = q.shape
    if k.shape != q.shape or k.dtype != q.dtype:
        raise ValueError(f"k must match q ({q.dtype} {tuple(q.shape)}), got {k.dtype} {tuple(k.shape)}")
    if v.dim() != 4 or v.shape[:3] != q.shape[:3] or v.dtype != q.dtype:
        raise ValueError(f"v must be {q.dtype} [{B}, {T}, {H}, V], got {v.dtype} {tuple(v.shape)}")
    if g.shape != q.shape[:3] or g.dtype not in _FLOATS:
        raise ValueError(f"g must be a float [{B}, {T}, {H}] tensor, got {g.dtype} {tuple(g.shape)}")
    N = B
    if cu_seqlens is not None:
        if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2 or cu_seqlens.dtype not in (torch.int32, torch.int64):
            raise ValueError("cu_seqlens must be a 1-D int32/int64 tensor [N+1]")
        if B != 1:
            raise ValueError(f"cu_seqlens requires B == 1, got B = {B}")
        cu = cu_seqlens.tolist()
        if cu[0] != 0 or cu[-1] != T or any(a > b for a, b in zip(cu, cu[1:])):
            raise ValueError(f"cu_seqlens must be non-decreasing from 0 to T = {T}, got {cu}")
        N = len(cu) - 1
    if initial_state is not None and tuple(initial_state.shape) != (N, H, K, v.shape[-1]):
        raise ValueError(f"initial_state must be [{N}, {H}, {K}, {v.shape[-1]}], got {tuple(initial_state.shape)}")
    return N


def _chunk_bounds(L, off_by_one=False):
    """(start, end) of the chunks of a length-L sequence: CHUNK tokens each, the last one may be partial."""
    bounds, start = [], 0
    stop = L - 1 if off_by_one else L  # bug_chunk_boundary: stops at the last index, not at the length
    while start < L:
        end = min(start + CHUNK, L)
        bounds.append((start, end))
        if end >= stop:
            break
        start = end
    return bounds


def _simple_gla(q, k, v, g, scale, initial_state, output_final_state, cu_seqlens, *, precision="mixed", bug=None):
    """Shared chunked implementation. For a chunk with entry state S0 [H, K, V] and G = cumsum(g) over the chunk:

        O     = scale * (Q * exp(G)) S0 + scale * ((Q K^T) * D) V,   D[i, j] = exp(G_i - G_j) if j <= i else 0
        S_end = exp(G_last) S0 + (K * exp(G_last - G))^T V

    precision="mixed": matmul operands in q's dtype with float32 accumulation; S, G and D in float32.
    precision="input": everything (g, G, exp, matmuls, S) in q's dtype.
    bug: None or one of "state_leak", "chunk_boundary", "double_scale", "last_gate" (see the bug_* functions).
    """
    N = _check_inputs(q, k, v, g, initial_state, cu_seqlens)
    B, T, H, K = q.shape
    scale = K ** -0.5 if scale is None else scale
    op = q.dtype                                                # dtype of every matmul operand
    acc = torch.float32 if precision == "mixed" else q.dtype    # dtype of S, G and of matmul sums

    def dot(a, b):  # operands rounded to the input dtype, products summed in `acc` (a tensor-core dot on CPU)
        return a.to(op).to(acc) @ b.to(op).to(acc)

    cu = cu_seqlens.tolist() if cu_seqlens is not None else None
    seqs = [(0, cu[n], cu[n + 1]) for n in range(N)] if cu is not None else [(b, 0, T) for b in range(B)]
    o = q.new_zeros(B, T, H, v.shape[-1])
    finals, S = [], None
    for n, (b, bos, eos) in enumerate(seqs):
        if initial_state is not None:
            S = initial_state[n].to(acc)
        elif S is None or not (bug == "state_leak" and cu is not None):
            S = q.new_zeros(H, K, v.shape[-1], dtype=acc)
        # else bug_state_leak: S still holds the previous packed sequence's final state
        qs, ks, vs = (x[b, bos:eos].transpose(0, 1) for x in (q, k, v))  # [H, L, K or V]
        gs = g[b, bos:eos].transpose(0, 1).to(acc)                       # [H, L]
        bounds = _chunk_bounds(eos - bos, off_by_one=bug == "chunk_boundary")
        for s, e in bounds:
            qc, kc, vc, G = qs[:, s:e], ks[:, s:e], vs[:, s:e], gs[:, s:e].cumsum(-1)
            causal = torch.ones(e - s, e - s, dtype=torch.bool, device=q.device).tril()
            D = (G[:, :, None] - G[:, None, :]).masked_fill(~causal, float("-inf")).exp()  # [H, C, C]
            A = dot(qc, kc.transpose(1, 2)) * D
            oc = scale * (dot(qc.to(acc) * G.exp()[..., None], S) + dot(A, vc))          # [H, C, V]
            if bug == "double_scale" and e - s < CHUNK:
                oc = oc * scale                            # bug_double_scale: partial last chunk scaled twice
            o[b, bos + s:bos + e] = oc.transpose(0, 1).to(q.dtype)
            last = bug == "last_gate" and (s, e) == bounds[-1]
            carry = (gs[:, e - 1] if last else G[:, -1]).exp()  # bug_last_gate: g_last instead of G_last
            S = carry[:, None, None] * S + dot((kc.to(acc) * (G[:, -1:] - G).exp()[..., None]).transpose(1, 2), vc)
        finals.append(S)
    return o, (torch.stack(finals).float() if output_final_state else None)


def chunk_simple_gla(q, k, v, g, *, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
    """Correct, tensor-core style ("mixed"): dot operands in q's dtype, float32 sums; S and G in float32."""
    return _simple_gla(q, k, v, g, scale, initial_state, output_final_state, cu_seqlens)


def chunk_simple_gla_input_dtype(q, k, v, g, *, scale=None, initial_state=None, output_final_state=False,
                                 cu_seqlens=None):
    """Correct, everything in q's dtype (g, G, exp, matmuls, state); final_state returned as float32."""
    return _simple_gla(q, k, v, g, scale, initial_state, output_final_state, cu_seqlens, precision="input")


def bug_state_leak(q, k, v, g, *, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
    """BUG: with cu_seqlens and no initial_state, each packed sequence starts from the previous one's final state."""
    return _simple_gla(q, k, v, g, scale, initial_state, output_final_state, cu_seqlens, bug="state_leak")


def bug_chunk_boundary(q, k, v, g, *, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
    """BUG: a sequence of length 64*n + 1 (n >= 1) drops its last token (o row 0, not in the state)."""
    return _simple_gla(q, k, v, g, scale, initial_state, output_final_state, cu_seqlens, bug="chunk_boundary")


def bug_double_scale(q, k, v, g, *, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
    """BUG: the output rows of a partial last chunk (length not a multiple of 64) get scale applied twice."""
    return _simple_gla(q, k, v, g, scale, initial_state, output_final_state, cu_seqlens, bug="double_scale")


def bug_last_gate(q, k, v, g, *, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
    """BUG: the last chunk carries its entry state with exp(g_last) instead of exp(G_last) (chunk's cumulative gate)."""
    return _simple_gla(q, k, v, g, scale, initial_state, output_final_state, cu_seqlens, bug="last_gate")
