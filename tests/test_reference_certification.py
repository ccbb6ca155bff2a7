"""Certify the float64 references against mpmath at 50 digits (``tests/mp_truth.py``), tiny shapes.

Bounds asserted (measured maxima in brackets, torch 2.13 CPU):

* kda, gla, simple_gla, gated_delta_rule, recurrent and chunked: relative RMS error of o and of the final state
  <= 1e-13 [2.3e-16], over batched / packed (empty sequences) / steep-decay (-1000 per step) cases,
  with initial states, the L2 norm and the in-kernel gate.
* attention: relative RMS error of o and of the finite lse <= 1e-13 [3.8e-16]; rows that see no key
  have o == 0 and lse == -inf exactly; with sliding windows, softcap and sinks (dense and flash forms)
  the same bound, and with sinks every row's lse is finite.
* paged_attention (dense and flash forms): the same bound against a key-by-key walk of the block table,
  GQA, MLA's absorbed head (one key head), speculative queries, pages shuffled in the pool.
* ``gates.softplus``: error <= 1 eps relative [0.44 eps] from -1000 to 1000, plus 5e-324 absolute
  where the true value is subnormal or below the float64 range (softplus(-1000) = 5e-435 -> 0).
* ``kda_gate``: ``|gate - truth| <= 2 eps (1 + c) |truth| + 1e-300`` [0.75 eps (1 + c)], c the
  relative condition number of the gate in x = g + dt_bias and in exp(A_log)
  (``mp_truth.gate_condition``): sigmoid(z) at z = -700 has c = 1400, so its 4e-14 relative error
  is the rounding of x and exp(A_log), not the reference's fault. The absolute 1e-300 covers
  results below the normal float64 range (e.g. ``-5 * sigmoid(-710)``, whose sigmoid is
  subnormal): a gate that small gives ``exp(gate) == 1.0``.
"""
from __future__ import annotations

import math
import sys

import mp_truth  # tests/ is on sys.path (pytest's rootdir-relative prepend import mode)
import mpmath
import numpy as np
import pytest
import torch

from refcheck import references
from refcheck.references.gates import softplus

EPS = sys.float_info.epsilon
RECURRENCE_BOUND = 1e-13
ATTENTION_BOUND = 1e-13
GATE_ULPS = 2.0
GATE_FLOOR = 1e-300
SUBNORMAL_SPACING = math.ulp(0.0)   # 5e-324: float64's resolution below its normal range
F64 = torch.float64


def _randn(gen, *shape):
    return torch.randn(*shape, generator=gen, dtype=F64)


def linear_case(op: str, case: str) -> tuple[tuple, dict]:
    """Tiny inputs of kda / gla / simple_gla: ``batched`` (B = 2, initial states), ``packed`` (three
    sequences, one empty; kda: L2 norm, in-kernel gate with dt_bias and safe_gate at lower_bound -5),
    ``steep`` (decays of -1000 at random steps; kda: the softplus gate with A_log = 5); gated_delta_rule's
    ``gva``: packed, two value heads per query/key head, the gate computed from A_log and dt_bias;
    ``beta_logits``: packed, beta as logits doubled in the kernel (allow_neg_eigval), states value-first."""
    gen = torch.Generator().manual_seed(sum(map(ord, op + case)))
    h, kd, vd = 2, 4, 3
    hv = 2 * h if case == "gva" else h       # gated_delta_rule's grouped value heads: two per query/key head
    b, t, cu = (2, 7, None) if case == "batched" else (1, 9, torch.tensor([0, 3, 3, 9], dtype=torch.int32))
    n = b if cu is None else len(cu) - 1
    gate_shape = (b, t, hv) if op in ("simple_gla", "gated_delta_rule") else (b, t, h, kd)
    g = torch.nn.functional.logsigmoid(_randn(gen, *gate_shape) + 1)
    if case == "steep":
        g = torch.where(torch.rand(gate_shape, generator=gen, dtype=F64) < 0.3, -1000.0, g)
    q, k, v = _randn(gen, b, t, h, kd), _randn(gen, b, t, h, kd) / kd ** 0.5, _randn(gen, b, t, hv, vd)
    kw = dict(cu_seqlens=cu, initial_state=_randn(gen, n, hv, kd, vd) if case != "steep" else None)
    if op not in ("kda", "gated_delta_rule"):
        return (q, k, v, g), kw
    beta = torch.rand(b, t, hv, generator=gen, dtype=F64)
    if op == "gated_delta_rule":
        kw.update(use_qk_l2norm=case in ("packed", "gva"), scale=0.7 if case == "steep" else None)
        if case == "gva":     # and the gate computed from the raw g, A_log and dt_bias
            g = 3 * _randn(gen, b, t, hv)
            kw.update(use_gate_in_kernel=True, A_log=torch.tensor([0.3, -1.0, 1.5, 0.0], dtype=F64),
                      dt_bias=_randn(gen, hv))
        if case == "beta_logits":   # beta as logits, 2 sigmoid(beta) in the kernel; states laid out [.., V, K]
            beta = 3 * _randn(gen, b, t, hv)
            kw.update(use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True, state_v_first=True,
                      initial_state=kw["initial_state"].transpose(-1, -2).contiguous())
        return (q, k, v, g, beta), kw
    if case == "packed":
        g = 3 * _randn(gen, b, t, h, kd)
        kw.update(use_qk_l2norm=True, use_gate_in_kernel=True, A_log=torch.tensor([0.3, -1.0], dtype=F64),
                  dt_bias=_randn(gen, h * kd), lower_bound=-5.0)
    if case == "steep":
        g = 10 * _randn(gen, b, t, h, kd)
        kw.update(use_gate_in_kernel=True, A_log=torch.tensor([5.0, 2.0], dtype=F64), scale=0.7)
    return (q, k, v, g, beta), kw


LINEAR_CASES = [(op, case) for op in ("kda", "gla", "simple_gla", "gated_delta_rule")
                for case in ("batched", "packed", "steep")] + [("gated_delta_rule", "gva"), ("gated_delta_rule", "beta_logits")]


@pytest.mark.parametrize("form", ["", "_chunked"], ids=["recurrent", "chunked"])
@pytest.mark.parametrize("op, case", LINEAR_CASES)
def test_linear_attention_within_bound_of_mpmath(op, case, form):
    args, kw = linear_case(op, case)
    o_mp, final_mp = getattr(mp_truth, op)(*args, **kw)
    extra = dict(chunk_size=4) if form else {}
    if kw.get("lower_bound") is not None:
        extra["safe_gate"] = True
    o, final = getattr(references, op + form)(*args, **kw, **extra, output_final_state=True)
    assert mp_truth.relative_error(o, o_mp) <= RECURRENCE_BOUND
    assert mp_truth.relative_error(final, final_mp) <= RECURRENCE_BOUND


ATTENTION_CASES = {   # T, S, H, Hk, Dqk, Dv, cu_seqlens_q, cu_seqlens_k
    "mha": (5, 5, 2, 2, 3, 2, None, None),
    "gqa T < S": (3, 6, 4, 2, 3, 4, None, None),
    "mqa T > S": (7, 4, 3, 1, 4, 2, None, None),
    "packed, empty key sequence": (9, 7, 2, 1, 3, 3, [0, 4, 6, 9], [0, 2, 2, 7]),
    "mla head dims": (3, 3, 1, 1, 192, 128, None, None),
}
# Cases with rows that see no key: causal with T > S, and an empty key sequence.
NO_KEY_ROWS = {("mqa T > S", True), ("packed, empty key sequence", False), ("packed, empty key sequence", True)}


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", list(ATTENTION_CASES))
def test_attention_within_bound_of_mpmath(case, causal):
    t, s, h, hk, dqk, dv, cu_q, cu_k = ATTENTION_CASES[case]
    gen = torch.Generator().manual_seed(len(case))
    b = 2 if cu_q is None else 1
    q, k, v = _randn(gen, b, t, h, dqk) * 2, _randn(gen, b, s, hk, dqk) * 2, _randn(gen, b, s, hk, dv)
    kw = dict(causal=causal)
    if cu_q is not None:
        kw.update(cu_seqlens_q=torch.tensor(cu_q), cu_seqlens_k=torch.tensor(cu_k))
    o_mp, lse_mp = mp_truth.attention(q, k, v, **kw)
    o, lse = references.attention(q, k, v, **kw)
    seen = torch.tensor(np.vectorize(lambda x: bool(mpmath.isfinite(x)))(lse_mp))
    assert torch.equal(torch.isfinite(lse), seen)
    assert bool((~seen).any()) == ((case, causal) in NO_KEY_ROWS)
    assert torch.all(lse[~seen] == float("-inf"))
    assert torch.all(o.transpose(1, 2)[~seen] == 0)           # o [B, T, H, Dv] -> [B, H, T, Dv]
    assert mp_truth.relative_error(o, o_mp) <= ATTENTION_BOUND
    assert mp_truth.relative_error(lse[seen], lse_mp[seen.numpy()]) <= ATTENTION_BOUND


ATTENTION_OPTIONS = {   # window, softcap and sinks over the cases above (sinks: [H], drawn)
    "window (2, 1)": dict(window_size=(2, 1)),
    "window (0, None), softcap 1.5": dict(window_size=(0, None), softcap=1.5),
    "sinks": dict(sinks=True),
    "window (1, 0), softcap 3, sinks": dict(window_size=(1, 0), softcap=3.0, sinks=True),
}


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("options", list(ATTENTION_OPTIONS))
@pytest.mark.parametrize("case", ["gqa T < S", "mqa T > S", "packed, empty key sequence"])
def test_attention_window_softcap_sinks_within_bound_of_mpmath(case, options, causal):
    """Both forms (dense and flash) against mpmath; with a sink, a row that sees no key gets lse = its sink
    and o = 0."""
    t, s, h, hk, dqk, dv, cu_q, cu_k = ATTENTION_CASES[case]
    gen = torch.Generator().manual_seed(len(case) + len(options))
    b = 2 if cu_q is None else 1
    q, k, v = _randn(gen, b, t, h, dqk) * 2, _randn(gen, b, s, hk, dqk) * 2, _randn(gen, b, s, hk, dv)
    kw: dict = dict(causal=causal, **ATTENTION_OPTIONS[options])
    if kw.get("sinks"):
        kw["sinks"] = _randn(gen, h) * 2
    if cu_q is not None:
        kw.update(cu_seqlens_q=torch.tensor(cu_q), cu_seqlens_k=torch.tensor(cu_k))
    o_mp, lse_mp = mp_truth.attention(q, k, v, **kw)
    seen = torch.tensor(np.vectorize(lambda x: bool(mpmath.isfinite(x)))(lse_mp))
    for form in (references.attention, references.attention_chunked):
        o, lse = form(q, k, v, **kw)
        assert torch.equal(torch.isfinite(lse), seen)
        assert torch.all(lse[~seen] == float("-inf"))
        assert mp_truth.relative_error(o, o_mp) <= ATTENTION_BOUND
        assert mp_truth.relative_error(lse[seen], lse_mp[seen.numpy()]) <= ATTENTION_BOUND
    if "sinks" in kw:
        assert bool(seen.all())                                 # every row has its sink


EXTREMES = [-1000.0, -800.0, -745.0, -740.0, -710.0, -700.0, -50.0, -40.0, -30.0, -20.0, -1.0, -1e-8,
            0.0, 1e-8, 1.0, 20.0, 20.5, 30.0, 40.0, 50.0, 700.0, 710.0, 1000.0]


PAGED_CASES = {   # N, Tq, H, Hk, Dqk, Dv, page, seqused
    "gqa one token": (3, 1, 4, 2, 3, 2, 2, [1, 4, 5]),
    "speculative": (2, 3, 2, 1, 4, 3, 3, [3, 8]),
    "latent head": (1, 2, 3, 1, 6, 4, 4, [9]),
}


@pytest.mark.parametrize("form", ["", "_chunked"], ids=["dense", "flash"])
@pytest.mark.parametrize("case", list(PAGED_CASES))
def test_paged_attention_within_bound_of_mpmath(case, form):
    n, tq, h, hk, dqk, dv, page, used = PAGED_CASES[case]
    gen = torch.Generator().manual_seed(len(case))
    counts = [-(-u // page) for u in used]
    pool = sum(counts) + 1
    order = torch.randperm(pool, generator=gen).tolist()
    rows, start = [], 0
    for c in counts:
        rows.append(order[start:start + c] + [order[-1]] * (max(counts) - c))
        start += c
    q = _randn(gen, n, tq, h, dqk) * 2
    k_cache, v_cache = _randn(gen, pool, page, hk, dqk) * 2, _randn(gen, pool, page, hk, dv)
    args = (q, k_cache, v_cache, torch.tensor(rows), torch.tensor(used))
    o_mp, lse_mp = mp_truth.paged_attention(*args, scale=0.6)
    o, lse = getattr(references, "paged_attention" + form)(*args, scale=0.6)
    assert mp_truth.relative_error(o, o_mp) <= ATTENTION_BOUND
    assert mp_truth.relative_error(lse, lse_mp) <= ATTENTION_BOUND


def test_softplus_within_one_eps_of_mpmath():
    x = torch.tensor(EXTREMES, dtype=F64)
    got = softplus(x).tolist()
    with mpmath.mp.workdps(mp_truth.DPS):
        for xi, fi in zip(EXTREMES, got):
            truth = mp_truth.softplus(mpmath.mpf(xi))
            assert abs(fi - truth) <= EPS * truth + SUBNORMAL_SPACING, f"softplus({xi}) = {fi!r}, truth {truth}"


def gate_inputs(lower_bound) -> tuple[torch.Tensor, torch.Tensor]:
    """g ``[1, N, 4, 1]`` for the heads A_log = -5, 0, 1, 5: the extreme grid, and for the sigmoid form
    also the g that put ``z = exp(A_log) g`` at the saturation points +-40, +-700 (and beyond)."""
    A_log = torch.tensor([-5.0, 0.0, 1.0, 5.0], dtype=F64)
    g = torch.tensor(EXTREMES, dtype=F64).view(-1, 1).expand(-1, 4)
    if lower_bound is not None:
        z = torch.tensor([-1000.0, -745.0, -710.0, -700.0, -40.0, -1.0, 0.0, 1.0, 40.0, 700.0], dtype=F64)
        g = torch.cat([g, z.view(-1, 1) / torch.exp(A_log)])
    return g.reshape(1, -1, 4, 1).contiguous(), A_log


@pytest.mark.parametrize("dt_bias", [None, [0.5, -0.25, 1e-3, -3.0]], ids=["no_dt_bias", "dt_bias"])
@pytest.mark.parametrize("lower_bound", [None, -5.0, -1.0, -1e-8])
def test_kda_gate_within_condition_bound_of_mpmath(lower_bound, dt_bias):
    g, A_log = gate_inputs(lower_bound)
    dt = None if dt_bias is None else torch.tensor(dt_bias, dtype=F64)
    got = references.kda_gate(g, A_log, dt, lower_bound).reshape(-1).tolist()
    truth = mp_truth.kda_gate(g, A_log, dt, lower_bound).reshape(-1)
    cond = mp_truth.gate_condition(g, A_log, dt, lower_bound).reshape(-1)
    with mpmath.mp.workdps(mp_truth.DPS):
        for i, (fi, ti, ci) in enumerate(zip(got, truth, cond)):
            bound = GATE_ULPS * EPS * (1 + ci) * abs(ti) + GATE_FLOOR
            assert abs(fi - ti) <= bound, f"entry {i}: gate {fi!r}, truth {mpmath.nstr(ti, 20)}"
