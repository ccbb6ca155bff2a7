"""The float64 references: chunked forms agree with the recurrences, bad input is rejected.

Agreement: ``kda_chunked``, ``gla_chunked``, ``simple_gla_chunked`` against ``kda``, ``gla``,
``simple_gla`` on Hypothesis-drawn cases (T = 0, 1, primes, chunk multiples +-1; packed sequences with
empty ones and int32/int64 ``cu_seqlens``; initial states; decays down to -1000 per step; the kda
gate and L2 norm options), to 1e-12 relative RMS on o, the final state and, for some cases, the
gradients of a random upstream. Measured over 400 drawn cases per op (60 with gradients): at most
5e-15 on o and the final state, 7.5e-15 on the gradients.

Rejection: every reference raises ``ValueError`` whose message starts with the offending argument.
"""
from __future__ import annotations

import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from refcheck import references

AGREEMENT = 1e-12
F64 = torch.float64


def assert_close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Relative RMS ``||got - want|| / ||want||`` within AGREEMENT (exact equality when want is 0)."""
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    err, ref = (got - want).norm().item(), want.norm().item()
    assert err <= AGREEMENT * ref, f"{what}: relative RMS error {err / ref if ref else err:.3g}"


# --------------------------------------------------------------------------- drawn cases

@st.composite
def lengths(draw, chunk: int) -> int:
    """A sequence length: 0, 1, a prime, or a multiple of the chunk one short, on or one past it."""
    return draw(st.one_of(
        st.sampled_from([0, 1, 2, 3, 5, 7, 13, 31, 67]),
        st.builds(lambda m, d: max(m * chunk + d, 0), st.integers(1, 2), st.integers(-1, 1))))


@st.composite
def linear_cases(draw, op: str) -> dict:
    """Inputs and options of one kda / gla / simple_gla call (float64, seeded)."""
    chunk = draw(st.sampled_from([1, 3, 8, 16, 64]))
    heads, kd, vd = draw(st.integers(1, 2)), draw(st.integers(1, 6)), draw(st.integers(1, 5))
    cu_seqlens = None
    if draw(st.booleans()):
        seqs = draw(st.lists(st.one_of(st.just(0), lengths(chunk)), min_size=1, max_size=4))
        batch, length = 1, sum(seqs)
        dtype = draw(st.sampled_from([torch.int32, torch.int64]))
        cu_seqlens = torch.tensor([0] + seqs, dtype=torch.int64).cumsum(0).to(dtype)
        n = len(seqs)
    else:
        batch, length = draw(st.integers(1, 2)), draw(lengths(chunk))
        n = batch
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=F64)

    gate_shape = (batch, length, heads) if op == "simple_gla" else (batch, length, heads, kd)
    g = torch.nn.functional.logsigmoid(2 * randn(*gate_shape) + 2)
    if draw(st.booleans()):   # steep decays: some steps forget almost everything
        g = torch.where(torch.rand(gate_shape, generator=gen, dtype=F64) < 0.2, -1000.0, g)
    x = dict(q=randn(batch, length, heads, kd), k=randn(batch, length, heads, kd) / kd ** 0.5,
             v=randn(batch, length, heads, vd), g=g)
    kw = dict(cu_seqlens=cu_seqlens, output_final_state=True, chunk_size=chunk)
    if draw(st.booleans()):
        kw["initial_state"] = randn(n, heads, kd, vd)
    if op == "kda":
        x["beta"] = torch.rand(batch, length, heads, generator=gen, dtype=F64)
        # With K = 1 the L2 norm is q / |q| = +-1: its gradient (1e-6 / |q|^3) is pure cancellation.
        kw["use_qk_l2norm"] = kd > 1 and draw(st.booleans())
        if draw(st.booleans()):
            x["g"] = 3 * randn(batch, length, heads, kd)
            kw.update(use_gate_in_kernel=True, A_log=randn(heads).clamp(-2, 5),
                      dt_bias=randn(heads * kd) if draw(st.booleans()) else None)
            if draw(st.booleans()):
                kw.update(safe_gate=True, lower_bound=draw(st.sampled_from([-5.0, -1.0, -1e-8])))
    return dict(x=x, kw=kw)


def upstream_gradients(o: torch.Tensor, final: torch.Tensor, wrt: list[torch.Tensor]) -> list[torch.Tensor]:
    """Gradients of ``<o, dO> + <final, dS>`` for a fixed random upstream (dO, dS); 0 where unused."""
    gen = torch.Generator().manual_seed(7)
    loss = (o * torch.randn(o.shape, generator=gen, dtype=F64)).sum() + \
        (final * torch.randn(final.shape, generator=gen, dtype=F64)).sum()
    grads = torch.autograd.grad(loss, wrt, allow_unused=True) if loss.requires_grad else [None] * len(wrt)
    return [torch.zeros_like(t) if d is None else d for t, d in zip(wrt, grads)]


def run_pair(op: str, case: dict, grads: bool = False) -> list[list[torch.Tensor]]:
    """For the recurrent and the chunked form: ``[o, final_state]`` and, with ``grads``, the upstream
    gradients with respect to every floating-point input (tensors, initial state, A_log, dt_bias)."""
    kw = dict(case["kw"])
    chunk = kw.pop("chunk_size")

    def leaf(t):
        return t.detach().requires_grad_(grads) if isinstance(t, torch.Tensor) and t.is_floating_point() else t

    results = []
    for fn, extra in ((getattr(references, op), {}), (getattr(references, f"{op}_chunked"), {"chunk_size": chunk})):
        inputs, options = {n: leaf(t) for n, t in case["x"].items()}, {n: leaf(t) for n, t in kw.items()}
        o, final = fn(*inputs.values(), **options, **extra)
        wrt = [t for t in [*inputs.values(), *options.values()] if isinstance(t, torch.Tensor) and t.requires_grad]
        results.append([o, final, *(upstream_gradients(o, final, wrt) if grads else [])])
    return results


@pytest.mark.parametrize("op", ["kda", "gla", "simple_gla"])
@settings(max_examples=60)
@given(data=st.data())
def test_chunked_equals_recurrent(op, data):
    case = data.draw(linear_cases(op))
    (o, final), (o_c, final_c) = run_pair(op, case)
    assert_close(o_c, o, "o")
    assert_close(final_c, final, "final_state")


@pytest.mark.parametrize("op", ["kda", "gla", "simple_gla"])
@settings(max_examples=10)
@given(data=st.data())
def test_chunked_gradients_equal_recurrent(op, data):
    case = data.draw(linear_cases(op))
    recurrent, chunked = run_pair(op, case, grads=True)
    for i, (got, want) in enumerate(zip(chunked, recurrent)):
        assert_close(got, want, f"output/gradient #{i}")


def test_chunked_matches_at_default_chunk_over_several_chunks():
    """T = 2 chunks + 1 at the default chunk size, steep decays, packed with an empty sequence."""
    gen = torch.Generator().manual_seed(3)
    t, h, kd, vd = 129, 2, 8, 4
    cu = torch.tensor([0, 60, 60, t], dtype=torch.int32)
    x = {name: torch.randn(1, t, h, d, generator=gen, dtype=F64) for name, d in (("q", kd), ("k", kd), ("v", vd))}
    x["g"] = -torch.rand(1, t, h, kd, generator=gen, dtype=F64)
    x["g"][0, ::17] = -1000.0
    beta = torch.rand(1, t, h, generator=gen, dtype=F64)
    for op, args, kw in (("kda", (*x.values(), beta), dict(use_qk_l2norm=True)), ("gla", tuple(x.values()), {})):
        o, s = getattr(references, op)(*args, cu_seqlens=cu, output_final_state=True, **kw)
        o_c, s_c = getattr(references, f"{op}_chunked")(*args, cu_seqlens=cu, output_final_state=True, **kw)
        assert_close(o_c, o, f"{op} o")
        assert_close(s_c, s, f"{op} final_state")


def test_chunked_forms_return_no_state_unless_asked():
    x = [torch.randn(1, 5, 1, 2, dtype=F64) for _ in range(3)]
    o, final = references.gla_chunked(*x, -torch.rand(1, 5, 1, 2, dtype=F64))
    assert final is None and o.shape == (1, 5, 1, 2)


@pytest.mark.parametrize("op", ["kda", "kda_chunked", "gated_delta_rule", "gated_delta_rule_chunked"])
def test_a_decode_step_over_a_state_pool_is_the_step_given_its_states(op):
    """The pool form (``recurrence.over_sequences``): sequence n starts from slot ``ssm_state_indices[n]``; in place,
    its final state lands there, no other slot changes, and none is returned; exactly the direct call's numbers."""
    gen = torch.Generator().manual_seed(5)
    r = lambda *s: torch.randn(*s, dtype=F64, generator=gen)  # noqa: E731
    b, h, kd, vd, slots = 3, 2, 4, 3, torch.tensor([4, 0, 2])
    x = dict(q=r(b, 1, h, kd), k=torch.nn.functional.normalize(r(b, 1, h, kd), dim=-1), v=r(b, 1, h, vd),
             g=-torch.rand(b, 1, h, *((kd,) if op.startswith("kda") else ()), dtype=F64, generator=gen),
             beta=torch.rand(b, 1, h, dtype=F64, generator=gen))
    fn, pool = getattr(references, op), r(6, h, kd, vd)
    o, final = fn(**x, initial_state=pool[slots].clone(), output_final_state=True)
    gathered, gathered_final = fn(**x, initial_state=pool.clone(), ssm_state_indices=slots, output_final_state=True)
    assert torch.equal(gathered, o) and torch.equal(gathered_final, final)
    written = pool.clone()
    o_pool, none = fn(**x, initial_state=written, ssm_state_indices=slots, inplace_final_state=True)
    others = [i for i in range(6) if i not in slots.tolist()]
    assert none is None and torch.equal(o_pool, o) and torch.equal(written[slots], final)
    assert torch.equal(written[others], pool[others])


# --------------------------------------------------------------------------- bad input

B, T, H, K, V = 2, 6, 4, 3, 5


def _inputs(op: str) -> tuple[dict, dict]:
    """A valid call of ``op``: (named positional tensors, keyword options)."""
    r = lambda *s: torch.randn(*s, dtype=F64)  # noqa: E731
    if op in ("kda", "kda_chunked"):
        return dict(q=r(B, T, H, K), k=r(B, T, H, K), v=r(B, T, H, V), g=-torch.rand(B, T, H, K, dtype=F64),
                    beta=torch.rand(B, T, H, dtype=F64)), {}
    if op in ("gla", "gla_chunked"):
        return dict(q=r(B, T, H, K), k=r(B, T, H, K), v=r(B, T, H, V), g=-torch.rand(B, T, H, K, dtype=F64)), {}
    if op in ("simple_gla", "simple_gla_chunked"):
        return dict(q=r(B, T, H, K), k=r(B, T, H, K), v=r(B, T, H, V), g=-torch.rand(B, T, H, dtype=F64)), {}
    if op == "attention":
        return dict(q=r(B, T, H, K), k=r(B, T + 1, 2, K), v=r(B, T + 1, 2, V)), {}
    assert op == "kda_gate"
    return dict(g=r(B, T, H, K), A_log=r(H)), {}


def _packed(x: dict, kw: dict, cu: list[int], dtype=torch.int64, name: str = "cu_seqlens"):
    """Keep batch row 0 only and pack it with boundaries ``cu``."""
    x = {n: t[:1] for n, t in x.items()}
    return x, {**kw, name: torch.tensor(cu, dtype=dtype)}


def _with(name, value):
    return lambda x, kw: ({**x, name: value(x[name]) if callable(value) else value}, kw)


def _opt(**options):
    return lambda x, kw: (x, {**kw, **options})


LINEAR = ["kda", "kda_chunked", "gla", "gla_chunked", "simple_gla", "simple_gla_chunked"]
SEQUENCE_MISTAKES = {   # (mutation, argument named in the error)
    "q rank 3": (_with("q", lambda t: t[0]), "q"),
    "q int": (_with("q", lambda t: t.to(torch.int32)), "q"),
    "q not a tensor": (_with("q", lambda t: t.tolist()), "q"),
    "k shape": (_with("k", lambda t: t[:, :, :, :-1]), "k"),
    "k bool": (_with("k", lambda t: t > 0), "k"),
    "v batch": (_with("v", lambda t: t[:1]), "v"),
    "v length": (_with("v", lambda t: t[:, 1:]), "v"),
    "g rank": (_with("g", lambda t: t[..., None]), "g"),
    "g length": (_with("g", lambda t: t[:, 1:]), "g"),
    "g int": (_with("g", lambda t: t.to(torch.int64)), "g"),
    "cu_seqlens with B > 1": (_opt(cu_seqlens=torch.tensor([0, 2, T])), "cu_seqlens"),
    "cu_seqlens decreasing": (lambda x, kw: _packed(x, kw, [0, 4, 2, T]), "cu_seqlens"),
    "cu_seqlens not from 0": (lambda x, kw: _packed(x, kw, [1, 3, T]), "cu_seqlens"),
    "cu_seqlens not to T": (lambda x, kw: _packed(x, kw, [0, 3, T - 1]), "cu_seqlens"),
    "cu_seqlens float": (lambda x, kw: _packed(x, kw, [0, 3, T], torch.float32), "cu_seqlens"),
    "cu_seqlens too short": (lambda x, kw: _packed(x, kw, [T]), "cu_seqlens"),
    "cu_seqlens 2-D": (lambda x, kw: (x, {**kw, "cu_seqlens": torch.tensor([[0, T]])}), "cu_seqlens"),
    "initial_state shape": (_opt(initial_state=torch.zeros(B + 1, H, K, V)), "initial_state"),
    "initial_state rank": (_opt(initial_state=torch.zeros(H, K, V)), "initial_state"),
    "initial_state int": (_opt(initial_state=torch.zeros(B, H, K, V, dtype=torch.int32)), "initial_state"),
    "initial_state bf16": (_opt(initial_state=torch.zeros(B, H, K, V, dtype=torch.bfloat16)), "initial_state"),
    "scale negative": (_opt(scale=-1.0), "scale"),
    "scale zero": (_opt(scale=0), "scale"),
}
KDA_MISTAKES = {
    "beta rank": (_with("beta", lambda t: t[..., None]), "beta"),
    "beta shape": (_with("beta", lambda t: t[:, :, :1]), "beta"),
    "beta int": (_with("beta", lambda t: t.to(torch.int32)), "beta"),
    "safe_gate without lower_bound": (_opt(safe_gate=True), "lower_bound"),
    "lower_bound below -5": (_opt(safe_gate=True, lower_bound=-5.5), "lower_bound"),
    "lower_bound 0": (_opt(safe_gate=True, lower_bound=0.0), "lower_bound"),
    "lower_bound positive": (_opt(safe_gate=True, lower_bound=1.0), "lower_bound"),
    "lower_bound not a number": (_opt(safe_gate=True, lower_bound="-1"), "lower_bound"),
    "lower_bound unused": (_opt(lower_bound=-1.0), "lower_bound"),
    "g outside the safe_gate promise": (lambda x, kw: ({**x, "g": x["g"] - 9}, {**kw, "safe_gate": True,
                                                                               "lower_bound": -5.0}), "g"),
    "use_gate_in_kernel without A_log": (_opt(use_gate_in_kernel=True), "A_log"),
    "A_log without use_gate_in_kernel": (_opt(A_log=torch.zeros(H)), "A_log"),
    "A_log shape": (_opt(use_gate_in_kernel=True, A_log=torch.zeros(H + 1)), "A_log"),
    "dt_bias shape": (_opt(use_gate_in_kernel=True, A_log=torch.zeros(H), dt_bias=torch.zeros(H)), "dt_bias"),
    "a pool without initial_state": (_opt(ssm_state_indices=torch.tensor([0, 1])), "initial_state"),
    "a pool of other heads": (_opt(initial_state=torch.zeros(4, H + 1, K, V), ssm_state_indices=torch.tensor([0, 1])),
                              "initial_state"),
    "a slot outside the pool": (_opt(initial_state=torch.zeros(4, H, K, V), ssm_state_indices=torch.tensor([0, 4])),
                                "ssm_state_indices"),
    "a slot per sequence": (_opt(initial_state=torch.zeros(4, H, K, V), ssm_state_indices=torch.tensor([0])),
                            "ssm_state_indices"),
    "float slots": (_opt(initial_state=torch.zeros(4, H, K, V), ssm_state_indices=torch.tensor([0.0, 1.0])),
                    "ssm_state_indices"),
    "one slot written twice": (_opt(initial_state=torch.zeros(4, H, K, V), ssm_state_indices=torch.tensor([2, 2]),
                                    inplace_final_state=True), "ssm_state_indices"),
    "in place and returned": (_opt(initial_state=torch.zeros(4, H, K, V), ssm_state_indices=torch.tensor([0, 1]),
                                   inplace_final_state=True, output_final_state=True), "output_final_state"),
    "in place without a pool": (_opt(initial_state=torch.zeros(B, H, K, V), inplace_final_state=True),
                                "inplace_final_state"),
}
SIMPLE_GLA_MISTAKES = {"g per channel": (_with("g", lambda t: t[..., None].expand(B, T, H, K)), "g")}
CHUNK_MISTAKES = {f"chunk_size {c!r}": (_opt(chunk_size=c), "chunk_size") for c in (0, -8, 2.5, True, "64")}
ATTENTION_MISTAKES = {
    "q rank 3": (_with("q", lambda t: t[0]), "q"),
    "q int": (_with("q", lambda t: t.to(torch.int64)), "q"),
    "k rank": (_with("k", lambda t: t[..., None]), "k"),
    "k head dim": (_with("k", lambda t: t[..., :-1]), "k"),
    "k batch": (_with("k", lambda t: t[:1]), "k"),
    "H % Hk != 0": (lambda x, kw: ({**x, "k": x["k"][:, :, :1].expand(-1, -1, 3, -1),
                                    "v": x["v"][:, :, :1].expand(-1, -1, 3, -1)}, kw), "k"),
    "v keys": (_with("v", lambda t: t[:, 1:]), "v"),
    "v heads": (_with("v", lambda t: t[:, :, :1]), "v"),
    "v int": (_with("v", lambda t: t.to(torch.int16)), "v"),
    "only cu_seqlens_q": (lambda x, kw: _packed(x, kw, [0, T], name="cu_seqlens_q"), "cu_seqlens_q"),
    "cu_seqlens_q with B > 1": (_opt(cu_seqlens_q=torch.tensor([0, T]), cu_seqlens_k=torch.tensor([0, T + 1])),
                                "cu_seqlens_q"),
    "cu_seqlens_q decreasing": (lambda x, kw: _packed(*_packed(x, kw, [0, 4, 2, T], name="cu_seqlens_q"),
                                                      [0, 1, 2, T + 1], name="cu_seqlens_k"), "cu_seqlens_q"),
    "cu_seqlens_k not to S": (lambda x, kw: _packed(*_packed(x, kw, [0, 2, T], name="cu_seqlens_q"),
                                                    [0, 1, T], name="cu_seqlens_k"), "cu_seqlens_k"),
    "cu_seqlens_k other count": (lambda x, kw: _packed(*_packed(x, kw, [0, 2, T], name="cu_seqlens_q"),
                                                       [0, T + 1], name="cu_seqlens_k"), "cu_seqlens_k"),
    "scale negative": (_opt(scale=-0.5), "scale"),
}
GATE_MISTAKES = {
    "g rank": (_with("g", lambda t: t[0]), "g"),
    "g int": (_with("g", lambda t: t.to(torch.int32)), "g"),
    "A_log shape": (_with("A_log", lambda t: t[:-1]), "A_log"),
    "A_log rank": (_with("A_log", lambda t: t[None]), "A_log"),
    "A_log int": (_with("A_log", lambda t: t.to(torch.int64)), "A_log"),
    "dt_bias shape": (_opt(dt_bias=torch.zeros(K)), "dt_bias"),
    "dt_bias int": (_opt(dt_bias=torch.zeros(H * K, dtype=torch.int32)), "dt_bias"),
    "lower_bound 0": (_opt(lower_bound=0.0), "lower_bound"),
    "lower_bound positive": (_opt(lower_bound=2.0), "lower_bound"),
    "lower_bound -inf": (_opt(lower_bound=float("-inf")), "lower_bound"),
}




def _mistakes():
    for op in LINEAR:
        table = dict(SEQUENCE_MISTAKES)
        table.update(KDA_MISTAKES if op.startswith("kda") else {})
        table.update(SIMPLE_GLA_MISTAKES if op.startswith("simple_gla") else {})
        table.update(CHUNK_MISTAKES if op.endswith("_chunked") else {})
        for label, (mutate, name) in table.items():
            yield pytest.param(op, mutate, name, id=f"{op}-{label}")
    for op, table in (("attention", ATTENTION_MISTAKES), ("kda_gate", GATE_MISTAKES)):
        for label, (mutate, name) in table.items():
            yield pytest.param(op, mutate, name, id=f"{op}-{label}")


@pytest.mark.parametrize("op, mutate, name", list(_mistakes()))
def test_bad_input_raises_value_error_naming_the_argument(op, mutate, name):
    x, kw = mutate(*_inputs(op))
    with pytest.raises(ValueError, match=rf"^{re.escape(name)}\b"):
        getattr(references, op)(*x.values(), **kw)


@pytest.mark.parametrize("op", LINEAR + ["attention", "kda_gate"])
def test_valid_base_call_runs(op):
    """The unmutated call of the table above is valid (so each mistake is what gets rejected)."""
    x, kw = _inputs(op)
    getattr(references, op)(*x.values(), **kw)


@pytest.mark.parametrize("dims, seqlens, causal, block", [
    ({"B": 2, "T": 9, "S": 13, "H": 4, "Hk": 2, "Dqk": 16, "Dv": 8}, None, True, 4),     # GQA, T < S, blocks of 4
    ({"B": 1, "T": 7, "S": 3, "H": 2, "Hk": 2, "Dqk": 24, "Dv": 20}, None, True, 64),    # rows without keys
    ({"B": 1, "T": 12, "S": 14, "H": 3, "Hk": 1, "Dqk": 8, "Dv": 8}, ([5, 0, 7], [7, 7, 0]), True, 3),  # empty spans
    ({"B": 1, "T": 2, "S": 1, "H": 1, "Hk": 1, "Dqk": 192, "Dv": 128}, None, False, 64),  # one key
])
def test_the_flash_form_of_attention_equals_the_dense_one(dims, seqlens, causal, block):
    """``attention_chunked`` (online softmax over key blocks, the flash backward) computes the dense
    reference's outputs and gradients in float64, rows without keys and empty spans included."""
    from refcheck.engine.verify import evaluate, upstream_gradients
    from refcheck.model.case import Case
    from refcheck.model.ops import card
    op = card("attention")
    case = Case.make("attention", dims, "fp32", 5, seqlens=seqlens and seqlens[0], seqlens_k=seqlens and seqlens[1],
                     options={"causal": causal})
    inputs = op.make_inputs(case, torch.device("cpu")).to_float64()
    dense = evaluate(references.attention, op, inputs, grads=True,
                     cotangents=lambda out: {n: g.double() for n, g in upstream_gradients(op, case, out).items()})
    flash = evaluate(lambda *a, **k: references.attention_chunked(*a, block_size=block, **k), op, inputs, grads=True,
                     cotangents=lambda out: {n: g.double() for n, g in upstream_gradients(op, case, out).items()})
    for name, want in dense.items():
        torch.testing.assert_close(flash[name], want, rtol=1e-12, atol=1e-12, equal_nan=True, msg=name)


def _paged(**change):
    """A valid paged decode call (q [2, 2, 4, 8], pages of 4 in a pool of 5, lengths 3 and 6), then ``change``."""
    gen = torch.Generator().manual_seed(1)
    x = dict(q=torch.randn(2, 2, 4, 8, generator=gen, dtype=F64), k_cache=torch.randn(5, 4, 2, 8, generator=gen, dtype=F64),
             v_cache=torch.randn(5, 4, 2, 6, generator=gen, dtype=F64), block_table=torch.tensor([[3, 4], [0, 2]]),
             seqused_k=torch.tensor([3, 6]))
    return {**x, **change}


PAGED_MISTAKES = {   # the call's change, the argument named
    "fewer tokens than queries": (dict(seqused_k=torch.tensor([1, 6])), "seqused_k"),
    "more tokens than the table holds": (dict(seqused_k=torch.tensor([3, 9])), "seqused_k"),
    "a page outside the pool": (dict(block_table=torch.tensor([[3, 4], [0, 5]])), "block_table"),
    "a negative page": (dict(block_table=torch.tensor([[-1, 4], [0, 2]])), "block_table"),
    "a table row per sequence": (dict(block_table=torch.tensor([[3, 4]])), "block_table"),
    "float lengths": (dict(seqused_k=torch.tensor([3.0, 6.0])), "seqused_k"),
    "key heads not dividing H": (dict(k_cache=torch.randn(5, 4, 3, 8, dtype=F64), v_cache=torch.randn(5, 4, 3, 6, dtype=F64)),
                                 "k_cache"),
    "values of another pool": (dict(v_cache=torch.randn(4, 4, 2, 6, dtype=F64)), "v_cache"),
    "keys of another head dim": (dict(k_cache=torch.randn(5, 4, 2, 7, dtype=F64)), "k_cache"),
}


@pytest.mark.parametrize("change, name", list(PAGED_MISTAKES.values()), ids=list(PAGED_MISTAKES))
def test_paged_bad_input_raises_value_error_naming_the_argument(change, name):
    with pytest.raises(ValueError, match=rf"^{re.escape(name)}\b"):
        references.paged_attention(**_paged(**change))


def test_paged_entries_past_a_sequences_pages_are_not_read():
    """The table's entries past a sequence's last page may hold anything (here an index outside the pool)."""
    o, _ = references.paged_attention(**_paged())
    again, _ = references.paged_attention(**_paged(block_table=torch.tensor([[3, 99], [0, 2]])))
    assert torch.equal(o, again)
