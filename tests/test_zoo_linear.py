"""The linear-attention zoo (``tests/zoo/linear.py``): kernels written from other standard formulas (chunked with a
hand-written backward and the gate gradient by a reverse cumulative sum, the WY form of the delta rule, the
recurrences in the input dtype) agree with the float64 truth, exactly in float64 and within the bounds in fp32,
bf16 and fp16, on fixed seeded cases and on the minimal degenerate ones; each buggy twin is caught."""
from __future__ import annotations

import itertools

import pytest
import torch

from refcheck import references
from refcheck.engine.verify import verify
from refcheck.model import registry
from refcheck.model.case import Case
from tests.zoo import linear as zoo

MEMBERS = {
    "simple_gla": ("simple_gla_chunk16_dg_cumsum", "simple_gla_chunk64_dg_cumsum", "simple_gla_recurrent_input_dtype"),
    "gla": ("gla_chunk16_dg_cumsum", "gla_chunk64_dg_cumsum", "gla_recurrent_input_dtype"),
    "gated_delta_rule": ("gated_delta_rule_wy_fp32", "gated_delta_rule_recurrent_input_dtype"),
}
CORRECT = [(op, name) for op, names in MEMBERS.items() for name in names]
FINAL = {"output_final_state": True}


def impl(op: str, name: str) -> registry.Implementation:
    return registry.resolve(f"{op}=tests.zoo.linear:{name}")[0]


@pytest.fixture(autouse=True)
def restore_registry(monkeypatch):
    """Resolving a user kernel registers it for the run: keep the registry as it was."""
    monkeypatch.setattr(registry, "_registry", dict(registry._registry))


# --- the algebra, exactly: float64 inputs against autograd through the float64 references ---------------------------

REFERENCES = {"simple_gla": references.simple_gla, "gla": references.gla, "gated_delta_rule": references.gated_delta_rule}


def float64_inputs(op: str, B: int, T: int, H: int, K: int, V: int, seqlens, h0: bool, steep: bool, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    k = randn(B, T, H, K)
    k = k / k.norm(dim=-1, keepdim=True) if op == "gated_delta_rule" else k * K ** -0.5
    g = torch.nn.functional.logsigmoid(randn(B, T, H, K) if op == "gla" else randn(B, T, H)) * (30 if steep else 1)
    args = [randn(B, T, H, K), k, randn(B, T, H, V), g]
    if op == "gated_delta_rule":
        args.append(torch.sigmoid(randn(B, T, H)))
    kwargs = {}
    if seqlens is not None:
        kwargs["cu_seqlens"] = torch.tensor([0, *itertools.accumulate(seqlens)])
    if h0:
        kwargs["initial_state"] = randn(B if seqlens is None else len(seqlens), H, K, V)
    return args, kwargs


def outputs_and_gradients(fn, args, kwargs, output_final_state: bool):
    leaves = [a.clone().requires_grad_(True) for a in args]
    kwargs = {n: t.clone().requires_grad_(t.is_floating_point()) for n, t in kwargs.items()}
    o, final = fn(*leaves, output_final_state=output_final_state, **kwargs)
    gen = torch.Generator().manual_seed(1)
    loss = (o * torch.randn(o.shape, generator=gen, dtype=o.dtype)).sum()
    if final is not None:
        loss = loss + (final * torch.randn(final.shape, generator=gen, dtype=final.dtype)).sum()
    loss.backward()
    grads = [t.grad for t in leaves] + ([kwargs["initial_state"].grad] if "initial_state" in kwargs else [])
    return [o] + ([final] if final is not None else []) + grads


SHAPES = [  # (B, T, H, K, V, seqlens): partial chunks, T = 1, K and V not powers of two, empty packed sequences
    (2, 40, 2, 5, 3, None), (1, 1, 1, 3, 2, None), (1, 130, 1, 7, 6, None), (1, 97, 2, 3, 5, (17, 0, 80)),
    (1, 65, 1, 4, 4, (0, 65, 0)),
]
EXACT = [(op, name) for op, name in CORRECT if "recurrent" not in name] + [
    ("simple_gla", "bug_simple_gla_dg_sign"), ("gla", "bug_gla_chunk_boundary_decay"),
    ("gated_delta_rule", "bug_gated_delta_rule_beta_once")]


@pytest.mark.parametrize("op, name", EXACT)
def test_the_chunked_algebra_is_exact_in_float64(op, name):
    """In float64 a correct chunked member equals the reference (outputs and every gradient, dg by its reverse
    cumulative sum included) to rounding, with steep gates too; a buggy twin does not."""
    worst = 0.0
    for (B, T, H, K, V, seqlens), h0, final, steep in itertools.product(SHAPES, (True, False), (True, False),
                                                                        (False, True)):
        args, kwargs = float64_inputs(op, B, T, H, K, V, seqlens, h0, steep)
        got = outputs_and_gradients(getattr(zoo, name), args, kwargs, final)
        want = outputs_and_gradients(REFERENCES[op], args, kwargs, final)
        assert len(got) == len(want)
        worst = max(worst, *((a - b).abs().max().item() / max(b.abs().max().item(), 1.0) for a, b in zip(got, want)))
    if name.startswith("bug_"):
        assert worst > 1e-2, worst
    else:
        assert worst < 1e-12, worst


# --- within the bounds: fixed seeded cases ---------------------------------------------------------------------------

def fixed_cases(op: str):
    """A dense batch with initial states, packed sequences (an empty one; K, V not powers of two), steep decay over
    a partial chunk with float32 gates, and float32 inputs with 16-bit gates: each in another dtype."""
    l2 = {"use_qk_l2norm": True} if op == "gated_delta_rule" else {}
    return [
        Case.make(op, dict(B=2, T=40, H=2, K=16, V=24), "fp32", 0, options=FINAL, draw={"initial_state": True}),
        Case.make(op, dict(B=1, T=97, H=2, K=12, V=20), "bf16", 1, seqlens=[17, 0, 80], options=dict(FINAL, **l2),
                  draw={"initial_state": True, "cu_dtype": "int64"}),
        Case.make(op, dict(B=1, T=70, H=1, K=16, V=16), "fp16", 2, options=FINAL,
                  draw={"initial_state": True, "normalizer": 0.1, "gate_dtype": "fp32"}),
        Case.make(op, dict(B=1, T=20, H=1, K=10, V=6), "fp32", 3, options=FINAL,
                  draw={"initial_state": True, "gate_dtype": "fp16" if op == "gla" else "bf16"}),
    ]


@pytest.mark.parametrize("op, name", CORRECT)
def test_each_member_passes_the_fixed_cases(op, name):
    kernel = impl(op, name)
    for case in fixed_cases(op):
        verdict = verify(kernel, case)
        assert verdict.passed, verdict.table()


# --- the minimal degenerate cases ------------------------------------------------------------------------------------

def degenerate_cases(op: str, dtype: str):
    """T = 1 without an initial state (the gate gradient is exactly 0: a kernel forming q dq - k dk leaves a
    rounding residue) and with one; simple GLA's K = 192, V = 16 with a state; K = 1 (fp16: one element per row)."""
    dims = {"B": 1, "H": 2, "K": 8, "T": 1, "V": 60}
    yield "T=1", Case.make(op, dims, dtype, 3, options=FINAL, draw={"initial_state": False, "gate_dtype": dtype})
    yield "T=1 fp32 gate", Case.make(op, dims, dtype, 3, draw={"initial_state": False, "gate_dtype": "fp32"})
    yield "T=1 h0", Case.make(op, dims, dtype, 3, options=FINAL, draw={"initial_state": True, "gate_dtype": dtype})
    if op == "simple_gla" and dtype == "fp32":
        yield "K=192", Case.make(op, {"B": 1, "H": 1, "K": 192, "T": 1, "V": 16}, dtype, 0, options=FINAL,
                                 draw={"initial_state": True})
    if dtype == "fp16":
        yield "K=1", Case.make(op, {"B": 1, "H": 1, "K": 1, "T": 1, "V": 64}, dtype, 0, seqlens=[1],
                               options={"output_final_state": False, "scale": 2.0},
                               draw={"cu_dtype": "int64", "gate_dtype": "bf16", "initial_state": False, "mask_p": 0.0,
                                     "normalizer": 1.0, "spike_p": 0.0})


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("op, name", CORRECT)
def test_each_member_passes_the_degenerate_cases(op, name, dtype):
    kernel = impl(op, name)
    failed = [f"{label}:\n{v.table()}" for label, case in degenerate_cases(op, dtype)
              if not (v := verify(kernel, case)).passed]
    assert not failed, "\n".join(failed)


# --- the buggy twins are caught ------------------------------------------------------------------------------------

def bug_case(op: str, T: int, dtype: str, **draw) -> Case:
    return Case.make(op, dict(B=1, T=T, H=1, K=8, V=8), dtype, 0, options=FINAL if op == "gated_delta_rule" else {},
                     draw=draw)


BUG_CASES = [
    # dg = 2 sum(S_T dS_T) instead of 0 at T = 1; a plain case; the sign-flipped dg is off by 2x its size
    ("simple_gla", "bug_simple_gla_dg_sign", Case.make("simple_gla", {"B": 1, "H": 2, "K": 8, "T": 1, "V": 60}, "fp32",
                                                       3, options=FINAL, draw={"initial_state": False})),
    ("simple_gla", "bug_simple_gla_dg_sign", bug_case("simple_gla", 24, "fp16")),
    ("simple_gla", "bug_simple_gla_dg_sign", bug_case("simple_gla", 24, "bf16")),
    # three chunks of 16 (the state crosses a boundary into a chunk that reads it), or an initial state
    ("gla", "bug_gla_chunk_boundary_decay", bug_case("gla", 40, "fp32")),
    ("gla", "bug_gla_chunk_boundary_decay", bug_case("gla", 24, "bf16", initial_state=True)),
    ("gla", "bug_gla_chunk_boundary_decay", bug_case("gla", 40, "fp16")),
    # beta < 1 on every step of a chunk
    ("gated_delta_rule", "bug_gated_delta_rule_beta_once", bug_case("gated_delta_rule", 24, "fp32")),
    ("gated_delta_rule", "bug_gated_delta_rule_beta_once", bug_case("gated_delta_rule", 24, "fp16")),
]


def bug_id(name: str, case: Case) -> str:
    return f"{name}-{case.dtype}-T{case.dim['T']}" + ("-h0" if case.drawn.get("initial_state") else "")


@pytest.mark.parametrize("op, name, case", BUG_CASES, ids=[bug_id(n, c) for _, n, c in BUG_CASES])
def test_each_buggy_twin_is_caught(op, name, case):
    verdict = verify(impl(op, name), case)
    assert not verdict.passed, verdict.table()


# --- the laws of serving: decode, grouped value heads, inputs rewritten, a state pool ----------------------------

SERVING = [(op, name, law) for op, name in CORRECT
           for law in ("decode_equals_prefill", "grouped_heads", "inputs_rewritten", "state_pool")
           if law not in ("grouped_heads", "state_pool") or op == "gated_delta_rule"]  # grouped heads, a state pool


@pytest.mark.parametrize("op, name, law", SERVING, ids=[f"{n}-{law}" for _, n, law in SERVING])
def test_correct_members_hold_the_serving_laws(op, name, law):
    """Written from other formulas (chunked with a hand-written backward, the WY form, the recurrence in the input
    dtype): one-token decode calls equal one call, a grouped call equals the repeated one (gated_delta_rule), new
    values in the same tensors give their truth, a decode step over a state pool equals the step given its states
    (gated_delta_rule); on the ci profile's draws."""
    from hypothesis import settings

    from refcheck.engine.laws import hypothesis_check
    from refcheck.strategies import profiles
    hypothesis_check(law, impl(op, name), settings=settings(**profiles.PROFILES["ci"]))
