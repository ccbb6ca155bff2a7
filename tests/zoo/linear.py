"""A zoo of linear-attention kernels in plain PyTorch, written from other standard formulas than the references,
plus buggy twins. User kernels (not registered): ``--impl simple_gla=tests.zoo.linear:NAME``.

Contracts (per sequence and head, state S: [K, V], S_0 = initial_state or zeros):

    simple_gla:        S_t = exp(g_t) S_{t-1} + k_t v_t^T                     g: [B, T, H]     (scalar log-decay)
    gla:               S_t = Diag(exp(g_t)) S_{t-1} + k_t v_t^T               g: [B, T, H, K]  (per channel)
    gated_delta_rule:  S'_t = exp(g_t) S_{t-1},  S_t = S'_t + beta_t k_t (v_t - S'_t^T k_t)^T
                                                                              g, beta: [B, T, HV]
    all:               o_t = scale * S_t^T q_t,  scale = K ** -0.5 unless given

    q, k: [B, T, H, K]  v: [B, T, H, V]  initial_state: float32 [N, H, K, V]  cu_seqlens: int [N+1] (then B == 1)
    gated_delta_rule's grouped value heads: v [B, T, HV, V], states [N, HV, K, V], HV a multiple of H, value
    head j reading query/key head j // (HV // H); its gate in the kernel: -exp(A_log) * softplus(g + dt_bias)
    -> o: [B, T, H, V] in q's dtype, final_state: float32 [N, H, K, V] or None

Inputs in fp32, bf16 or fp16 (float64 too, to check the algebra exactly); a gate of another float dtype is upcast
to float32 (float64 for float64 inputs) first.

Chunked GLA (``_ChunkedGLA``, chunk size C; gate columns Kg = 1 for simple GLA, K for GLA): in a chunk with entry
state S0, rows Q, Kc [C, K], V [C, V] and the chunk's cumulative log-decay G = cumsum(g) [C, Kg],

    D[i, j]  = exp(G_i - G_j) for j <= i, 0 above                                   [C, C, Kg]
    A[i, j]  = sum_k Q_ik Kc_jk D_ijk                                               [C, C]
    O        = scale * ((Q * exp(G)) S0 + A V)
    S_end    = Diag(exp(G_last)) S0 + (Kc * exp(G_last - G))^T V

Its hand-written backward, with dO the chunk's cotangent and dS the exit state's (from the next chunk, or the
final state's cotangent), chunks in reverse, dA = scale * (dO V^T) masked to j <= i:

    dQ   = scale * (dO S0^T) * exp(G) + sum_j dA_ij Kc_j D_ij
    dKc  = sum_i dA_ij Q_i D_ij + (V dS^T) * exp(G_last - G)
    dV   = scale * A^T dO + (Kc * exp(G_last - G)) dS
    dS0  = Diag(exp(G_last)) dS + scale * (Q * exp(G))^T dO

and the gate gradient as kernels form it. With b_t = sum_{s<=t} g_s, q_t enters only as q_t * exp(b_t), k_s only
as k_s * exp(-b_s), S_0 with no decay of its own, the final state with a factor exp(b_T); so per sequence

    dL/db_t = q_t * dq_t - k_t * dk_t + [t = T] sum_v S_T * dS_T,     dg_s = sum_{t >= s} dL/db_t

(summed over K for simple GLA): a reverse cumulative sum over time of q * dq - k * dk plus the final state's
term on every step (the initial state needs no term: its decays are the q-side's and the final state's). At
T = 1 without an initial state the truth is exactly 0 and this forms it as a difference of O(1) terms.

Precision of the chunked kernels: dot operands in the input dtype (q, k, v, dO; the decayed and the score
operands rounded to it), sums in float32; the state, its cotangent, G and D in float32.

Gated delta rule in the WY form (``_delta_chunk``), per chunk, with Dg[i, j] = exp(G_i - G_j) (j <= i):

    L  = strictly-lower(Diag(beta) (Kc Kc^T * Dg)),  T = (I + L)^{-1} (triangular solve)
    W  = T Diag(beta) (Kc * exp(G)),  Uv = T Diag(beta) V,  U = Uv - W S0
    O  = scale * ((Q * exp(G)) S0 + ((Q Kc^T) * Dg) U)
    S_end = exp(G_last) S0 + (Kc * exp(G_last - G))^T U

The recurrent members walk the recurrence step by step in the input dtype (state included; final state returned
as float32), gradients by autograd.
"""
from __future__ import annotations

import torch

from refcheck.references.contract import check_linear_qkv, check_scale, check_shape, check_state, check_tensor, sequence_spans

__all__ = [
    "simple_gla_chunk16_dg_cumsum", "simple_gla_chunk64_dg_cumsum", "gla_chunk16_dg_cumsum", "gla_chunk64_dg_cumsum",
    "simple_gla_recurrent_input_dtype", "gla_recurrent_input_dtype", "gated_delta_rule_wy_fp32",
    "gated_delta_rule_recurrent_input_dtype",
    "bug_simple_gla_dg_sign", "bug_gla_chunk_boundary_decay", "bug_gated_delta_rule_beta_once",
]

L2NORM_EPS = 1e-6


# --- contract ----------------------------------------------------------------------------------------------------

def _spans(q, k, v, g, beta, initial_state, cu_seqlens, *, channel_gate: bool):
    """Check the inputs of a linear op; return its sequences [(row, start, end)]."""
    b, t, h, kd, vd = check_linear_qkv(q, k, v)
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"k, v: expected q's dtype {q.dtype}, got {k.dtype}, {v.dtype}")
    check_tensor("g", g, 4 if channel_gate else 3)
    check_shape("g", g, (b, t, h, kd) if channel_gate else (b, t, h), "[B, T, H, K]" if channel_gate else "[B, T, H]")
    if beta is not None:
        check_tensor("beta", beta, 3)
        check_shape("beta", beta, (b, t, h), "[B, T, H]")
    spans = sequence_spans(cu_seqlens, b, t)
    if initial_state is not None:
        check_state("initial_state", initial_state, len(spans), h, kd, vd)
    return spans


def _grouped(q, k, v):
    """Grouped value heads (HV, a multiple of q's H): q and k with value head j reading query/key head
    j // (HV // H), one head per value head."""
    check_tensor("q", q, 4)
    check_tensor("k", k, 4)
    check_shape("k", k, q.shape, "[B, T, H, K] like q")
    check_tensor("v", v, 4)
    if v.shape[2] % q.shape[2]:
        raise ValueError(f"v: HV = {v.shape[2]} value heads, expected a multiple of q's H = {q.shape[2]}")
    heads = torch.arange(v.shape[2], device=q.device) // (v.shape[2] // q.shape[2])
    return q[:, :, heads], k[:, :, heads]


def _in_kernel_gate(g, use_gate_in_kernel, A_log, dt_bias):
    """The delta rule's decay: ``g`` itself, or from the raw gate ``-exp(A_log) * softplus(g + dt_bias)`` per
    value head, in float32 (stored in g's dtype)."""
    if not use_gate_in_kernel:
        if A_log is not None or dt_bias is not None:
            raise ValueError("A_log, dt_bias: given without use_gate_in_kernel=True")
        return g
    x = g.float() + (dt_bias.float() if dt_bias is not None else 0.0)
    return (-A_log.float().exp() * torch.nn.functional.softplus(x)).to(g.dtype)


def _acc(dtype: torch.dtype) -> torch.dtype:
    """The accumulation dtype: float32, float64 for float64 inputs (the exact check of the algebra)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _causal(c: int, device, strict: bool = False) -> torch.Tensor:
    return torch.ones(c, c, dtype=torch.bool, device=device).tril(-1 if strict else 0)


def _revcumsum(x: torch.Tensor, dim: int) -> torch.Tensor:
    return x.flip(dim).cumsum(dim).flip(dim)


# --- chunked GLA / simple GLA with a hand-written backward ---------------------------------------------------------

class _Chunk:
    """The per-chunk quantities shared by the forward and the backward (module docstring): for one chunk of
    all heads, q, k [H, C, K], v [H, C, V] in the input dtype, g [H, C, Kg] in the accumulation dtype."""

    def __init__(self, q, k, v, g, bug):
        self.op, self.acc = q.dtype, g.dtype
        self.q, self.k, self.v = q, k, v
        self.scalar = g.shape[-1] == 1
        self.G = g.cumsum(1)                                                          # [H, C, Kg]
        c = g.shape[1]
        mask = _causal(c, g.device)[None, :, :, None]
        self.D = (self.G[:, :, None] - self.G[:, None, :]).masked_fill(~mask, float("-inf")).exp()   # [H, C, C, Kg]
        self.last = self.G[:, -1]                                                     # [H, Kg]
        # bug_gla_chunk_boundary_decay: the state crosses the boundary decayed by the last step's own gate
        self.carry = (g[:, -1] if bug == "boundary_decay" else self.last).exp()[..., None]   # [H, Kg, 1]
        self.after = (self.last[:, None] - self.G).exp()                             # exp(G_last - G) [H, C, Kg]
        self.kd = self.round(k.to(self.acc) * self.after)                            # Kc * exp(G_last - G)
        self.A = self.gram(q, k)                                                      # [H, C, C]

    def f(self, x):
        return x.to(self.acc)

    def round(self, x):
        """A dot operand: rounded to the input dtype, summed in the accumulation dtype."""
        return x.to(self.op).to(self.acc)

    def gram(self, x, y):
        """P[i, j] = sum_k x_ik y_jk D_ijk."""
        if self.scalar:
            return (self.f(x) @ self.f(y).transpose(1, 2)) * self.D[..., 0]
        return torch.einsum("hik,hjk,hijk->hij", self.f(x), self.f(y), self.D)

    def rows(self, p, y):
        """R[i, k] = sum_j p_ij y_jk D_ijk (p masked to j <= i by D)."""
        if self.scalar:
            return self.round(p * self.D[..., 0]) @ self.f(y)
        return torch.einsum("hij,hjk,hijk->hik", p, self.f(y), self.D)

    def cols(self, p, x):
        """R[j, k] = sum_i p_ij x_ik D_ijk."""
        if self.scalar:
            return self.round(p * self.D[..., 0]).transpose(1, 2) @ self.f(x)
        return torch.einsum("hij,hik,hijk->hjk", p, self.f(x), self.D)

    def read(self, S):
        """(Q * exp(G)) S0: for a scalar gate the decay is applied after the dot (exactly the same product)."""
        if self.scalar:
            return (self.f(self.q) @ S) * self.G.exp()
        return self.round(self.f(self.q) * self.G.exp()) @ S

    def forward(self, S, scale):
        o = scale * (self.read(S) + self.round(self.A) @ self.f(self.v))
        return self.carry * S + self.kd.transpose(1, 2) @ self.f(self.v), o

    def backward(self, S, dS, do, scale):
        """Cotangents (dq, dk, dv, dS0) of the chunk, given its entry state S, exit cotangent dS and dO."""
        do = self.f(do)
        dA = scale * (do @ self.f(self.v).transpose(1, 2))                            # masked by D in rows/cols
        dq = scale * (do @ S.transpose(1, 2)) * self.G.exp() + self.rows(dA, self.k)
        dk = self.cols(dA, self.q) + (self.f(self.v) @ dS.transpose(1, 2)) * self.after
        dv = scale * self.round(self.A).transpose(1, 2) @ do + self.kd @ dS
        dS0 = self.carry * dS + scale * self.round(self.f(self.q) * self.G.exp()).transpose(1, 2) @ do
        return dq, dk, dv, dS0


def _chunks(start: int, end: int, size: int):
    return [(s, min(s + size, end)) for s in range(start, end, size)]


class _ChunkedGLA(torch.autograd.Function):
    """o, final_state of (simple) GLA by chunks; backward by the chunked formulas and dg by the reverse cumsum."""

    @staticmethod
    def forward(ctx, q, k, v, g, h0, spans, scale, chunk, bug):
        # q, k [B, T, H, K]; v [B, T, H, V] (input dtype); g [B, T, H, Kg] (accumulation dtype); h0 [N, H, K, V] or None
        B, T, H, K = q.shape
        acc = g.dtype
        o = q.new_zeros(B, T, H, v.shape[-1])
        entries, finals = [], []
        for n, (b, s, e) in enumerate(spans):
            S = h0[n].to(acc) if h0 is not None else q.new_zeros(H, K, v.shape[-1], dtype=acc)
            seq = []
            for c0, c1 in _chunks(s, e, chunk):
                x = _Chunk(*(t[b, c0:c1].transpose(0, 1) for t in (q, k, v, g)), bug)
                seq.append(S)
                S, oc = x.forward(S, scale)
                o[b, c0:c1] = oc.transpose(0, 1).to(q.dtype)
            entries.append(seq)
            finals.append(S)
        final = torch.stack(finals)
        ctx.save_for_backward(q, k, v, g, final)
        ctx.has_h0, ctx.h0_dtype = h0 is not None, None if h0 is None else h0.dtype
        ctx.spans, ctx.scale, ctx.chunk, ctx.bug, ctx.entries = spans, scale, chunk, bug, entries
        return o, final.float() if acc == torch.float32 else final

    @staticmethod
    def backward(ctx, do, dfinal):
        q, k, v, g, final = ctx.saved_tensors
        acc = g.dtype
        dq, dk = (torch.zeros(q.shape, dtype=acc, device=q.device) for _ in range(2))
        dv = torch.zeros(v.shape, dtype=acc, device=v.device)
        dg = torch.zeros(g.shape, dtype=acc, device=g.device)
        dh0 = []
        dfinal = torch.zeros_like(final) if dfinal is None else dfinal.to(acc)
        for n, (b, s, e) in enumerate(ctx.spans):
            dS = dfinal[n]
            for (c0, c1), S in reversed(list(zip(_chunks(s, e, ctx.chunk), ctx.entries[n]))):
                x = _Chunk(*(t[b, c0:c1].transpose(0, 1) for t in (q, k, v, g)), ctx.bug)
                dqc, dkc, dvc, dS = x.backward(S, dS, do[b, c0:c1].transpose(0, 1), ctx.scale)
                dq[b, c0:c1], dk[b, c0:c1], dv[b, c0:c1] = (t.transpose(0, 1) for t in (dqc, dkc, dvc))
            dh0.append(dS)
            # dL/db_t = q_t dq_t - k_t dk_t (+ sum_v S_T dS_T at t = T), dg_s = sum_{t >= s} dL/db_t
            term = q[b, s:e].to(acc) * dq[b, s:e] - k[b, s:e].to(acc) * dk[b, s:e]             # [L, H, K]
            if ctx.bug == "dg_sign":
                term = -term            # bug_simple_gla_dg_sign: k * dk - q * dq
            last = (final[n] * dfinal[n]).sum(-1)                                                 # [H, K]
            if g.shape[-1] == 1:
                term, last = term.sum(-1, keepdim=True), last.sum(-1, keepdim=True)
            dg[b, s:e] = _revcumsum(term, 0) + last
        dh0 = torch.stack(dh0).to(ctx.h0_dtype) if ctx.has_h0 else None
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dg, dh0, None, None, None, None


def _chunked_gla(q, k, v, g, scale, initial_state, output_final_state, cu_seqlens, *, chunk, bug=None):
    """Check the contract and run ``_ChunkedGLA``: g [B, T, H] (simple GLA) or [B, T, H, K] (GLA)."""
    spans = _spans(q, k, v, g, None, initial_state, cu_seqlens, channel_gate=g.dim() == 4)
    scale = check_scale(scale, q.shape[-1])
    gate = g.to(_acc(q.dtype))
    gate = gate.unsqueeze(-1) if g.dim() == 3 else gate
    o, final = _ChunkedGLA.apply(q, k, v, gate, initial_state, spans, scale, chunk, bug)
    return o, (final if output_final_state else None)


# --- the recurrences in the input dtype ----------------------------------------------------------------------------

def _recurrent(step, q, tensors, initial_state, output_final_state, spans, v_dim):
    """Walk ``S, o_t = step(S, x_t)`` over each sequence in ``q.dtype``; tensors: name -> [B, T, H, ...]."""
    B, T, H, K = q.shape
    rows = [[] for _ in range(B)]
    finals = []
    for n, (b, s, e) in enumerate(spans):
        S = initial_state[n].to(q.dtype) if initial_state is not None else q.new_zeros(H, K, v_dim)
        xs = {name: t[b, s:e].unbind(0) for name, t in tensors.items()}
        for i in range(e - s):
            S, o_t = step(S, {name: x[i] for name, x in xs.items()})
            rows[b].append(o_t.unsqueeze(0))
        finals.append(S)
    o = torch.stack([torch.cat(r) if r else q.new_zeros(0, H, v_dim) for r in rows])
    return o, (torch.stack(finals).to(_acc(q.dtype)) if output_final_state else None)


def _gla_recurrent(q, k, v, g, scale, initial_state, output_final_state, cu_seqlens):
    spans = _spans(q, k, v, g, None, initial_state, cu_seqlens, channel_gate=g.dim() == 4)
    scale = check_scale(scale, q.shape[-1])
    gate = g.to(_acc(g.dtype)).to(q.dtype)
    gate = gate.unsqueeze(-1) if g.dim() == 3 else gate                               # [B, T, H, 1 or K]

    def step(S, x):
        S = S * x["g"].exp()[..., None] + x["k"][..., None] * x["v"][:, None, :]
        return S, scale * torch.einsum("hkv,hk->hv", S, x["q"])

    return _recurrent(step, q, dict(q=q, k=k, v=v, g=gate), initial_state, output_final_state, spans, v.shape[-1])


# --- the gated delta rule --------------------------------------------------------------------------------------------

def _l2norm(x):
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


def _delta_chunk(S, q, k, v, g, beta, scale, bug):
    """One chunk of the WY form (module docstring) for all heads: q, k [H, C, K], v [H, C, V], g, beta [H, C]."""
    c = g.shape[-1]
    G = g.cumsum(-1)
    Dg = (G[:, :, None] - G[:, None, :]).masked_fill(~_causal(c, g.device), float("-inf")).exp()
    kk = (k @ k.transpose(1, 2)) * Dg
    # bug_gated_delta_rule_beta_once: beta on the values, not on the k k^T term
    L = (kk if bug == "beta_once" else beta[..., None] * kk).masked_fill(~_causal(c, g.device, strict=True), 0)
    eye = torch.eye(c, dtype=g.dtype, device=g.device).expand_as(L)
    Tinv = torch.linalg.solve_triangular(eye + L, eye, upper=False, unitriangular=True)
    W = Tinv @ (beta[..., None] * k * G.exp()[..., None])
    U = Tinv @ (beta[..., None] * v) - W @ S
    o = scale * ((q * G.exp()[..., None]) @ S + ((q @ k.transpose(1, 2)) * Dg) @ U)
    S = G[:, -1, None, None].exp() * S + (k * (G[:, -1:] - G).exp()[..., None]).transpose(1, 2) @ U
    return S, o


def _gated_delta_rule(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, use_qk_l2norm, *,
                      form, chunk=64, bug=None):
    """form "wy": chunks of ``chunk`` in the accumulation dtype, autograd; "recurrent": step by step in q's dtype."""
    q, k = _grouped(q, k, v)
    spans = _spans(q, k, v, g, beta, initial_state, cu_seqlens, channel_gate=False)
    scale = check_scale(scale, q.shape[-1])
    out = q.dtype
    dt = _acc(out) if form == "wy" else out
    q, k, v, beta = (x.to(dt) for x in (q, k, v, beta))
    g = g.to(_acc(g.dtype)).to(dt)
    if use_qk_l2norm:
        q, k = _l2norm(q), _l2norm(k)
    if form == "recurrent":
        def step(S, x):
            S = S * x["g"].exp()[:, None, None]
            u = x["beta"][:, None] * (x["v"] - torch.einsum("hkv,hk->hv", S, x["k"]))
            S = S + x["k"][..., None] * u[:, None, :]
            return S, scale * torch.einsum("hkv,hk->hv", S, x["q"])
        return _recurrent(step, q, dict(q=q, k=k, v=v, g=g, beta=beta), initial_state, output_final_state, spans,
                          v.shape[-1])
    B, T, H, K = q.shape
    rows = [[] for _ in range(B)]
    finals = []
    for n, (b, s, e) in enumerate(spans):
        S = initial_state[n].to(dt) if initial_state is not None else q.new_zeros(H, K, v.shape[-1])
        for c0, c1 in _chunks(s, e, chunk):
            S, o = _delta_chunk(S, *(x[b, c0:c1].transpose(0, 1) for x in (q, k, v, g, beta)), scale, bug)
            rows[b].append(o.transpose(0, 1))
        finals.append(S)
    o = torch.stack([torch.cat(r) if r else q.new_zeros(0, H, v.shape[-1]) for r in rows]).to(out)
    return o, (torch.stack(finals) if output_final_state else None)


def _pooled(run, initial_state, output_final_state, ssm_state_indices, inplace_final_state):
    """Serving's state pool, apart from the references' bookkeeping: ``run(initial_state, output_final_state)``
    over the slots ``ssm_state_indices`` names (``index_select``), the final states written back into them
    (``index_copy_``) with ``inplace_final_state``."""
    if ssm_state_indices is None:
        return run(initial_state, output_final_state)
    slots = ssm_state_indices.long()
    o, final = run(initial_state.index_select(0, slots), True)
    if not inplace_final_state:
        return o, (final if output_final_state else None)
    initial_state.index_copy_(0, slots, final.to(initial_state.dtype))
    return o, None


# --- the zoo -----------------------------------------------------------------------------------------------------

def simple_gla_chunk16_dg_cumsum(q, k, v, g, *, scale=None, initial_state=None, output_final_state=False,
                                 cu_seqlens=None):
    """Chunks of 16: O = scale ((Q exp(G)) S0 + ((Q K^T) * exp(G_i - G_j)) V); hand-written backward,
    dg = revcumsum_t(sum_K (q dq - k dk)) + sum(S_T dS_T)."""
    return _chunked_gla(q, k, v, g, scale, initial_state, output_final_state, cu_seqlens, chunk=16)


def simple_gla_chunk64_dg_cumsum(q, k, v, g, *, scale=None, initial_state=None, output_final_state=False,
                                 cu_seqlens=None):
    """Chunks of 64: O = scale ((Q exp(G)) S0 + ((Q K^T) * exp(G_i - G_j)) V); hand-written backward,
    dg = revcumsum_t(sum_K (q dq - k dk)) + sum(S_T dS_T)."""
    return _chunked_gla(q, k, v, g, scale, initial_state, output_final_state, cu_seqlens, chunk=64)


def gla_chunk16_dg_cumsum(q, k, v, g, *, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
    """Chunks of 16: A_ij = sum_k Q_ik K_jk exp(G_ik - G_jk), O = scale ((Q exp(G)) S0 + A V); hand-written
    backward, dg = revcumsum_t(q dq - k dk) + sum_V(S_T dS_T) per channel."""
    return _chunked_gla(q, k, v, g, scale, initial_state, output_final_state, cu_seqlens, chunk=16)


def gla_chunk64_dg_cumsum(q, k, v, g, *, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
    """Chunks of 64: A_ij = sum_k Q_ik K_jk exp(G_ik - G_jk), O = scale ((Q exp(G)) S0 + A V); hand-written
    backward, dg = revcumsum_t(q dq - k dk) + sum_V(S_T dS_T) per channel."""
    return _chunked_gla(q, k, v, g, scale, initial_state, output_final_state, cu_seqlens, chunk=64)


def simple_gla_recurrent_input_dtype(q, k, v, g, *, scale=None, initial_state=None, output_final_state=False,
                                     cu_seqlens=None):
    """S_t = exp(g_t) S_{t-1} + k_t v_t^T, o_t = scale S_t^T q_t, step by step in q's dtype; autograd."""
    return _gla_recurrent(q, k, v, g, scale, initial_state, output_final_state, cu_seqlens)


def gla_recurrent_input_dtype(q, k, v, g, *, scale=None, initial_state=None, output_final_state=False,
                              cu_seqlens=None):
    """S_t = Diag(exp(g_t)) S_{t-1} + k_t v_t^T, o_t = scale S_t^T q_t, step by step in q's dtype; autograd."""
    return _gla_recurrent(q, k, v, g, scale, initial_state, output_final_state, cu_seqlens)


def gated_delta_rule_wy_fp32(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False,
                             cu_seqlens=None, use_qk_l2norm=False, use_gate_in_kernel=False, A_log=None, dt_bias=None,
                             ssm_state_indices=None, inplace_final_state=False):
    """Chunks of 64 in float32, WY form: T = (I + tril_-1(beta K K^T * Dg))^{-1}, W = T beta K exp(G),
    U = T beta V - W S0, O = scale ((Q exp(G)) S0 + (Q K^T * Dg) U); autograd; a state pool (``_pooled``)."""
    g = _in_kernel_gate(g, use_gate_in_kernel, A_log, dt_bias)
    return _pooled(lambda h0, final: _gated_delta_rule(q, k, v, g, beta, scale, h0, final, cu_seqlens, use_qk_l2norm,
                                                       form="wy"),
                   initial_state, output_final_state, ssm_state_indices, inplace_final_state)


def gated_delta_rule_recurrent_input_dtype(q, k, v, g, beta, *, scale=None, initial_state=None,
                                           output_final_state=False, cu_seqlens=None, use_qk_l2norm=False,
                                           use_gate_in_kernel=False, A_log=None, dt_bias=None, ssm_state_indices=None,
                                           inplace_final_state=False):
    """S' = exp(g_t) S, S_t = S' + beta_t k_t (v_t - S'^T k_t)^T, o_t = scale S_t^T q_t, step by step in q's
    dtype; autograd; a state pool (``_pooled``)."""
    g = _in_kernel_gate(g, use_gate_in_kernel, A_log, dt_bias)
    return _pooled(lambda h0, final: _gated_delta_rule(q, k, v, g, beta, scale, h0, final, cu_seqlens, use_qk_l2norm,
                                                       form="recurrent"),
                   initial_state, output_final_state, ssm_state_indices, inplace_final_state)


def bug_simple_gla_dg_sign(q, k, v, g, *, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
    """BUG: simple_gla_chunk64_dg_cumsum with dg = revcumsum(sum_K (k dk - q dq)) + sum(S_T dS_T): wrong sign."""
    return _chunked_gla(q, k, v, g, scale, initial_state, output_final_state, cu_seqlens, chunk=64, bug="dg_sign")


def bug_gla_chunk_boundary_decay(q, k, v, g, *, scale=None, initial_state=None, output_final_state=False,
                                 cu_seqlens=None):
    """BUG: gla_chunk16_dg_cumsum whose state crosses a chunk boundary decayed by exp(g_last) (the last step's
    gate), not exp(G_last) (the chunk's cumulative gate)."""
    return _chunked_gla(q, k, v, g, scale, initial_state, output_final_state, cu_seqlens, chunk=16,
                        bug="boundary_decay")


def bug_gated_delta_rule_beta_once(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False,
                                   cu_seqlens=None, use_qk_l2norm=False,
        use_gate_in_kernel=False, A_log=None, dt_bias=None):
    """BUG: gated_delta_rule_wy_fp32 with L = tril_-1(K K^T * Dg): beta applied to V (and W) but not to K K^T."""
    g = _in_kernel_gate(g, use_gate_in_kernel, A_log, dt_bias)
    return _gated_delta_rule(q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, use_qk_l2norm,
                             form="wy", bug="beta_once")
