"""Quick checks of ``optimized.gated_delta_rule_recurrent`` and ``optimized.gated_delta_rule_chunk`` on the CPU
(faithful Triton interpreter) against the float64 reference over their options (grouped value heads, packed
sequences, the gate and beta in the kernel, the value-first layout, a state pool written in place; the chunked
kernel's gradients), bad input, and kernel mutants that the laws catch. The laws run over both too
(``refcheck/properties``, implementations ``triton_recurrent`` and ``triton``)."""
from __future__ import annotations

import itertools

import pytest
import torch

from refcheck.runtime import interpreter

interpreter.interpret_new_kernels()  # before the kernel modules are imported
interpreter.enable()

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from refcheck import optimized, references  # noqa: E402
from refcheck.model.case import Case  # noqa: E402
from refcheck.optimized.gated_delta_rule import recurrent  # noqa: E402
from refcheck.optimized.kda import blocks, chunk_fwd  # noqa: E402

FP32_ERROR = 2e-6
"""Largest absolute error of o and the final state allowed against float64 for fp32 inputs (measured
7.1e-7 over every option combination at these sizes)."""


def inputs(B=2, T=5, H=2, HV=4, K=16, V=32, seed=0, gate=False, beta_logits=False):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    q, k = r(B, T, H, K), r(B, T, H, K)
    x = dict(q=q / q.norm(dim=-1, keepdim=True), k=k / k.norm(dim=-1, keepdim=True), v=r(B, T, HV, V),
             g=r(B, T, HV) if gate else -torch.rand(B, T, HV, generator=gen),
             beta=2 * r(B, T, HV) if beta_logits else torch.rand(B, T, HV, generator=gen))
    options = {}
    if gate:
        options.update(use_gate_in_kernel=True, A_log=0.5 * r(HV), dt_bias=r(HV))
    return x, options


def to64(d: dict) -> dict:
    return {n: x.double() if torch.is_tensor(x) and x.is_floating_point() else x for n, x in d.items()}


@pytest.mark.parametrize("gate, beta_logits, v_first, packed, pool", [
    c for c in itertools.product([False, True], repeat=5) if sum(c) in (0, 1, 3, 5)])
def test_recurrent_matches_float64(gate, beta_logits, v_first, packed, pool):
    """o and the final state (returned, or written into the pool's named slots, the others untouched) at fp32
    accuracy, grouped value heads (2 per query/key head) and l2norm of q and k throughout."""
    x, options = inputs(gate=gate, beta_logits=beta_logits)
    options.update(use_qk_l2norm=True, state_v_first=v_first)
    if beta_logits:
        options.update(use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True)
    if packed:
        x = {n: t.reshape(1, -1, *t.shape[2:])[:, :8] for n, t in x.items()}
        options["cu_seqlens"] = torch.tensor([0, 5, 5, 8])
    n = 3 if packed else 2
    shape = (4, 32, 16) if v_first else (4, 16, 32)
    gen = torch.Generator().manual_seed(9)
    if pool:
        states, slots = torch.randn(n + 2, *shape, generator=gen), torch.tensor([3, 0, 4][:n])
        ours, truth = states.clone(), states.double()
        o, final = optimized.gated_delta_rule_recurrent(**x, **options, initial_state=ours, ssm_state_indices=slots,
                                                        inplace_final_state=True)
        ro, _ = references.gated_delta_rule(**to64(x), **to64(options), initial_state=truth, ssm_state_indices=slots,
                                            inplace_final_state=True)
        assert final is None
        final, want = ours, truth
    else:
        h0 = torch.randn(n, *shape, generator=gen)
        o, final = optimized.gated_delta_rule_recurrent(**x, **options, initial_state=h0, output_final_state=True)
        ro, want = references.gated_delta_rule(**to64(x), **to64(options), initial_state=h0.double(),
                                               output_final_state=True)
    assert (o.double() - ro).abs().max() <= FP32_ERROR
    assert (final.double() - want).abs().max() <= FP32_ERROR


def _bad(**change):
    x, options = inputs()
    with pytest.raises(ValueError) as err:
        optimized.gated_delta_rule_recurrent(**(x | options | change))
    return str(err.value)


@pytest.mark.parametrize("change, name", [
    (dict(v=torch.randn(2, 5, 3, 32)), "v"),                                   # HV not a multiple of H
    (dict(g=torch.randn(2, 5, 4, 16)), "g"),                                   # a gate per key channel
    (dict(A_log=torch.randn(4)), "A_log"),                                     # without use_gate_in_kernel
    (dict(use_gate_in_kernel=True, A_log=torch.randn(2)), "A_log"),            # [H], not [HV]
    (dict(allow_neg_eigval=True), "allow_neg_eigval"),
    (dict(initial_state=torch.randn(2, 4, 16, 32).double()), "initial_state"),
    (dict(initial_state=torch.randn(5, 4, 16, 32), ssm_state_indices=torch.tensor([0, 5])), "ssm_state_indices"),
    (dict(inplace_final_state=True), "inplace_final_state"),
    (dict(q=torch.randn(2, 5, 2, 300), k=torch.randn(2, 5, 2, 300)), "q"),
    (dict(v=torch.randn(2, 5, 4, 32).half()), "v"),
])
def test_recurrent_bad_input_names_the_argument(change, name):
    assert name in _bad(**change)


def _law_fails(law: str, options: dict | None = None, draw: dict | None = None, impl: str = "triton_recurrent",
               dims: dict | None = None) -> bool:
    from refcheck.engine.laws import LawViolation
    from refcheck.engine.reproduce import law as run_law
    case = Case.make("gated_delta_rule", dims or dict(B=2, T=3, H=1, HV=2, K=16, V=16), "fp32", 5,
                     options=options or {}, draw=draw or {})
    try:
        run_law(law, impl, case)
    except LawViolation:
        return True
    return False


@triton.jit
def slot_ignored(slot, hv, HV, K: tl.constexpr, V: tl.constexpr, kk, vv, V_FIRST: tl.constexpr):
    """Every sequence's state read from and written to slot 0 (the slot index dropped)."""
    base = hv.to(tl.int64) * K * V
    if V_FIRST:
        return base + vv[None, :] * K + kk[:, None]
    return base + kk[:, None] * V + vv[None, :]


@triton.jit
def value_first_ignored(slot, hv, HV, K: tl.constexpr, V: tl.constexpr, kk, vv, V_FIRST: tl.constexpr):
    """The state always addressed key-first: a value-first state is read and written transposed."""
    return (slot.to(tl.int64) * HV + hv) * K * V + kk[:, None] * V + vv[None, :]


def test_state_mutants_are_caught_by_their_laws(monkeypatch):
    """Our kernel with the pool slot dropped fails the state-pool law (19); with a value-first state read and
    written key-first (K = V here: the shapes agree, the values are transposed), agreement with float64 (law 1).
    Unmutated, both hold."""
    v_first = {"state_v_first": True, "output_final_state": True}
    assert not _law_fails("state_pool") and not _law_fails("agreement", v_first, {"initial_state": True})
    with monkeypatch.context() as patch:
        patch.setattr(recurrent, "state_offsets", slot_ignored)
        assert _law_fails("state_pool")
    monkeypatch.setattr(recurrent, "state_offsets", value_first_ignored)
    assert _law_fails("agreement", v_first, {"initial_state": True})


@pytest.mark.parametrize("config", [dict(BV=16, num_warps=1), dict(BV=128, num_warps=8)])
def test_launch_configs_and_unchecked_slots_compute_the_same(config):
    """Other launches (value columns a program, warps) and ``check_slots=False`` give the same bits here: each
    column's sums run over K alone, and the check reads nothing the kernel uses. (On a GPU the warps lay out the
    sums over K, and with them their order: the same within rounding, not bitwise.)"""
    x, options = inputs(gate=True)
    pool = torch.randn(6, 4, 16, 32, generator=torch.Generator().manual_seed(3))
    slots = torch.tensor([4, 1])
    runs = []
    for kw in ({}, dict(config=config, check_slots=False)):
        states = pool.clone()
        o, _ = optimized.gated_delta_rule_recurrent(**x, **options, initial_state=states, ssm_state_indices=slots,
                                                    inplace_final_state=True, **kw)
        runs.append((o, states))
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])


@pytest.mark.parametrize("config", [dict(BV=24), dict(BV=8), dict(num_warps=3), dict(block=16)])
def test_bad_launch_config_names_it(config):
    assert "config" in _bad(config=config)


# ----------------------------------------------------------------------------------------- the chunked kernel

GRAD_RELATIVE = 2e-5
"""Largest error of every gradient of the chunked kernel against float64 relative to the gradient's largest
magnitude, fp32 inputs at precision "ieee" (measured at most 3.9e-6, dA_log's, over the cases below)."""


def _grads(fn, x: dict, options: dict, h0, dtype):
    """o, the final state and the gradients of every floating input of a call of fn, with random upstream gradients
    (seeded), inputs converted to dtype."""
    leaves = {n: t.detach().to(dtype).requires_grad_() for n, t in (x | options | {"initial_state": h0}).items()
              if torch.is_tensor(t) and t.is_floating_point()}
    kwargs = {**x, **options, **leaves}
    o, final = fn(**kwargs, output_final_state=True)
    gen = torch.Generator().manual_seed(11)
    torch.autograd.backward([o, final], [torch.randn(o.shape, generator=gen).to(o.dtype),
                                         torch.randn(final.shape, generator=gen).to(final.dtype)])
    return o, final, {n: t.grad for n, t in leaves.items()}


@pytest.mark.parametrize("case", ["groups", "gate_logits_packed_v_first", "strong_decay_no_norm"])
def test_chunk_matches_float64_with_gradients(case):
    """o, the final state and every gradient (q, k, v, g, beta, the initial state, A_log and dt_bias) of the chunked
    kernel against float64, across chunk and sub-chunk boundaries (T = 70: two chunks, five sub-chunks): grouped value
    heads (2 per query/key head) with the norm of q and k; the gate's function and beta's sigmoid in the kernel over
    packed sequences of 30, 0 and 110 tokens with a value-first state; a decay of up to 30 a step without the norm
    (every sub-chunk past the span that KDA's per-channel dots could take; the scalar gate's need none)."""
    gate = logits = packed = v_first = False
    HV, l2norm = 4, True
    if case == "gate_logits_packed_v_first":
        gate = logits = packed = v_first = True
    elif case == "strong_decay_no_norm":
        HV, l2norm = 2, False
    x, options = inputs(T=70, HV=HV, gate=gate, beta_logits=logits)
    if case == "strong_decay_no_norm":
        x["g"] = 30 * x["g"]
    options.update(use_qk_l2norm=l2norm, state_v_first=v_first)
    if logits:
        options.update(use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True)
    if packed:
        x = {n: t.reshape(1, -1, *t.shape[2:]) for n, t in x.items()}
        options["cu_seqlens"] = torch.tensor([0, 30, 30, 140])
    n = 3 if packed else 2
    h0 = torch.randn(n, HV, *((32, 16) if v_first else (16, 32)), generator=torch.Generator().manual_seed(9))
    o, final, grads = _grads(lambda **kw: optimized.gated_delta_rule_chunk(**kw, precision="ieee"), x, options, h0,
                             torch.float32)
    ro, want, truth = _grads(references.gated_delta_rule, x, options, h0, torch.float64)
    assert (o.double() - ro).abs().max() <= FP32_ERROR
    assert (final.double() - want).abs().max() <= FP32_ERROR
    assert set(grads) == set(truth)
    for name, dx in grads.items():
        assert (dx.double() - truth[name]).abs().max() <= GRAD_RELATIVE * truth[name].abs().max(), name


def test_chunk_state_pool_written_in_place():
    """A prefill from pool slots: each sequence starts from its slot, its final state is written back there, every
    other slot keeps its bits."""
    x, options = inputs(T=20, gate=True)
    pool = torch.randn(5, 4, 16, 32, generator=torch.Generator().manual_seed(4))
    slots = torch.tensor([3, 1])
    ours, truth = pool.clone(), pool.double()
    o, final = optimized.gated_delta_rule_chunk(**x, **options, initial_state=ours, ssm_state_indices=slots,
                                                inplace_final_state=True, precision="ieee")
    ro, _ = references.gated_delta_rule(**to64(x), **to64(options), initial_state=truth, ssm_state_indices=slots,
                                        inplace_final_state=True)
    assert final is None
    assert (o.double() - ro).abs().max() <= FP32_ERROR and (ours.double() - truth).abs().max() <= FP32_ERROR
    assert torch.equal(ours[[0, 2, 4]], pool[[0, 2, 4]])


@pytest.mark.parametrize("change, name", [
    (dict(g=torch.randn(2, 5, 4, 16)), "g"),
    (dict(A_log=torch.randn(4)), "A_log"),
    (dict(precision="fp16"), "precision"),
    (dict(segment_chunks=-1), "segment_chunks"),
    (dict(inplace_final_state=True), "inplace_final_state"),
])
def test_chunk_bad_input_names_the_argument(change, name):
    x, options = inputs()
    with pytest.raises(ValueError) as err:
        optimized.gated_delta_rule_chunk(**(x | options | change))
    assert name in str(err.value)


@triton.jit
def wrong_key_head(h, H, GROUP):
    """Value head h reads query/key head ``h % (H / GROUP)``: the heads of a group spread over the query/key heads."""
    return h % (H // GROUP), H // GROUP


@triton.jit
def decay_dropped(G_i, G_j):
    """The blocks below the diagonal summed without their decay."""
    return tl.full((G_i.shape[0], G_j.shape[0]), 1.0, tl.float32)


def test_chunk_mutants_are_caught_by_their_laws(monkeypatch):
    """Our chunked kernel with each value head reading the wrong query/key head fails the grouped-heads law (its dense
    call has q and k repeated per group); with the decay left out of the blocks below the diagonal, agreement with
    float64 (T = 40: three sub-chunks). Unmutated, both hold."""
    def fails(law):
        return _law_fails(law, impl="triton", dims=dict(B=1, T=40, H=2, HV=4, K=16, V=16))
    assert not fails("grouped_heads") and not fails("agreement")
    with monkeypatch.context() as patch:
        patch.setattr(chunk_fwd, "key_head", wrong_key_head)
        assert fails("grouped_heads")
    monkeypatch.setattr(blocks, "cross_decay", decay_dropped)
    assert fails("agreement")
