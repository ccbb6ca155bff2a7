"""Quick checks of ``optimized.attention`` on the CPU (faithful Triton interpreter) against the float64
reference: forward (o, lse) and every gradient through both outputs, bad input, and that a kernel
with the classic top-left causal mask is caught. The laws run over it too (``refcheck/properties``)."""
from __future__ import annotations

import pytest
import torch

from refcheck.runtime import interpreter

interpreter.interpret_new_kernels()  # before the kernel modules are imported
interpreter.enable()

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from refcheck import optimized, references  # noqa: E402
from refcheck.model import budgets  # noqa: E402
from refcheck.model.case import Case  # noqa: E402
from refcheck.model.metrics import rel_rms  # noqa: E402
from refcheck.model.naive import fp8_attention  # noqa: E402
from refcheck.model.ops.attention import fp8_inputs  # noqa: E402
from refcheck.optimized import common  # noqa: E402
from refcheck.optimized.attention import forward as forward_module  # noqa: E402
from refcheck.optimized.attention.api import DEFAULT_PRECISION  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# relative RMS error allowed, by (input dtype, precision): fp32 with fp32-accurate dots sits near 3e-7;
# bf16/fp16 round P and dS to the input dtype before their dots (measured: bf16 3e-3, fp16 4e-4)
TOL = {("fp32", "ieee"): 2e-6, ("fp32", "tf32x3"): 2e-6, ("fp32", "tf32"): 5e-3, ("bf16", "tf32"): 1e-2,
       ("fp16", "tf32"): 2e-3}


def rel(x, ref) -> float:
    x, ref = x.detach().double(), ref.detach()
    return float((x - ref).norm() / ref.norm().clamp_min(1e-30))


def attention_case(B=1, T=40, S=40, H=2, Hk=1, Dqk=32, Dv=32, dtype="fp32", lengths=None, seed=0):
    """q, k, v rounded to dtype; packed with ``lengths = (query lengths, key lengths)``."""
    gen = torch.Generator().manual_seed(seed)
    dt = DTYPES[dtype]
    x = {"q": torch.randn(B, T, H, Dqk, generator=gen).to(dt), "k": torch.randn(B, S, Hk, Dqk, generator=gen).to(dt),
         "v": torch.randn(B, S, Hk, Dv, generator=gen).to(dt)}
    if lengths is not None:
        x["cu_seqlens_q"], x["cu_seqlens_k"] = (torch.tensor([0, *n]).cumsum(0) for n in lengths)
    return x


def run(fn, x, cot, **options):
    """o, lse and the gradients of q, k, v for the cotangents ``cot = (do, dlse)``."""
    leaves = {n: x[n].detach().clone().requires_grad_() for n in ("q", "k", "v")}
    o, lse = fn(**leaves, **{n: t for n, t in x.items() if n not in leaves}, **options)
    grads = torch.autograd.grad((o, lse), list(leaves.values()), (cot[0].to(o.dtype), cot[1].to(lse.dtype)))
    return o, lse, dict(zip(leaves, grads))


def errors(x, causal, **knobs):
    """Relative RMS errors of o, lse (over rows that see a key) and dq, dk, dv against float64."""
    gen = torch.Generator().manual_seed(1)
    B, T, H, _ = x["q"].shape
    cot = (torch.randn(B, T, H, x["v"].shape[-1], generator=gen, dtype=torch.float64),
           torch.randn(B, H, T, generator=gen, dtype=torch.float64))
    o, lse, grads = run(optimized.attention, x, cot, causal=causal, **knobs)
    x64 = {n: (t.double() if t.is_floating_point() else t) for n, t in x.items()}
    ro, rlse, rgrads = run(references.attention, x64, cot, causal=causal)
    assert o.dtype == x["q"].dtype and lse.dtype == torch.float32 and o.shape == ro.shape and lse.shape == rlse.shape
    empty = torch.isneginf(rlse)
    assert torch.equal(torch.isneginf(lse), empty)
    assert bool((o.transpose(1, 2)[empty] == 0).all())         # a row that sees no key: o = 0 exactly
    return {"o": rel(o, ro), "lse": rel(lse[~empty], rlse[~empty])} | {f"d{n}": rel(grads[n], rgrads[n]) for n in grads}


CASES = {
    "fp32 ieee GQA causal T > S": (dict(B=2, T=50, S=40, H=4, Hk=2, Dqk=32, Dv=24), True, dict(precision="ieee")),
    "fp32 tf32x3 varlen empty spans causal": (dict(T=45, S=45, H=3, Hk=1, Dqk=40, Dv=16,
                                                   lengths=((13, 0, 27, 5), (20, 5, 20, 0))),
                                              True, dict(precision="tf32x3")),
    "fp32 tf32 varlen non-causal": (dict(T=40, S=45, lengths=((13, 0, 27), (20, 5, 20))), False, dict()),
    "bf16 MLA 192/128 causal": (dict(T=70, S=70, Dqk=192, Dv=128, dtype="bf16"), True, dict()),
    "fp16 GQA 3 D=64 block_m=64": (dict(T=70, S=90, H=3, Hk=1, Dqk=64, Dv=64, dtype="fp16"), False,
                                   dict(block_m=64)),
    "bf16 D=256 causal S > T": (dict(T=20, S=30, H=1, Dqk=256, Dv=256, dtype="bf16"), True, dict()),
    # spans of several blocks: the unmasked loops over blocks every query (key) of a program sees
    "fp32 ieee varlen causal long spans": (dict(T=400, S=420, H=2, Hk=1, Dqk=24, Dv=16,
                                                lengths=((130, 0, 200, 70), (160, 60, 200, 0))),
                                           True, dict(precision="ieee")),
    "fp32 ieee causal T > S block_m=64": (dict(T=330, S=200, H=2, Hk=2, Dqk=32, Dv=16), True,
                                          dict(precision="ieee", block_m=64)),
    "bf16 persistent varlen causal": (dict(T=300, S=290, H=3, Hk=1, Dqk=64, Dv=32, dtype="bf16",
                                           lengths=((150, 0, 140, 10), (100, 40, 150, 0))), True,
                                      dict(schedule="persistent", block_m=64)),
}


@pytest.mark.parametrize("causal", [True, False])
def test_persistent_forward_is_bitwise_the_grid_forward(causal):
    """Each tile's arithmetic is the same whichever program runs it: o and lse agree bit for bit, in
    the interpreter's two programs looping over 3 query blocks x 2 sequences x 2 heads."""
    x = attention_case(T=300, S=260, H=2, Hk=1, Dqk=48, Dv=32, dtype="fp16", lengths=((170, 130), (100, 160)))
    grid = optimized.attention(**x, causal=causal)
    persistent = optimized.attention(**x, causal=causal, schedule="persistent")
    assert all(torch.equal(a, b) for a, b in zip(grid, persistent))


@pytest.mark.parametrize("dtype, dims, causal", [("bf16", (64, 32), True), ("fp16", (192, 128), False),
                                                  ("fp32", (24, 8), True)])
def test_tma_loads_give_the_bits_of_pointer_loads(dtype, dims, causal):
    """Blocks loaded through TMA descriptors hold the next sequence's rows where pointer loads read zeros
    (packed sequences, GQA, MLA's split head dim): masked to p = 0 and dS = 0, they change no bit of o,
    lse, dq, dk or dv."""
    from refcheck.optimized.attention.api import _tokens
    from refcheck.optimized.attention.backward import backward
    from refcheck.optimized.attention.layout import make_layout
    x = attention_case(T=300, S=260, H=4, Hk=2, Dqk=dims[0], Dv=dims[1], dtype=dtype, lengths=((170, 130), (100, 160)))
    lay = make_layout(x["q"], x["k"], x["v"], x["cu_seqlens_q"], x["cu_seqlens_k"], scale=dims[0] ** -0.5,
                      causal=causal, precision="tf32")
    q, k, v = (_tokens(x[n]) for n in "qkv")
    do = torch.randn(q.shape[0], 4, dims[1], generator=torch.Generator().manual_seed(3)).to(q.dtype)
    assert common.tma_aligned(q, k, v, do)
    results = []
    for tma in (False, True):
        o, lse = forward_module.forward(q, k, v, lay, 64, ladder=[dict(BN=32, num_warps=4, num_stages=2, TMA=tma)])
        grads = backward(q, k, v, o, lse, do, None, lay, dq_ladder=[dict(BM=64, BN=32, TMA=tma)],
                         dkdv_ladder=[dict(BN=64, BM=32, TMA=tma)])
        results.append((o, lse, *grads))
    assert all(torch.equal(a, b) for a, b in zip(*results))


@pytest.mark.parametrize("schedule", ["grid", "persistent"])
def test_fallback_blocks_compute_the_same(monkeypatch, schedule):
    """Where a GPU refuses every launch setting of a block size (OutOfResources: fp32 at head dims 256
    with "tf32x3" offline for sm_90), the ladders go on with smaller blocks -- forward 64 query rows
    instead of 128, dq_kernel 32, dkdv_kernel 64 keys instead of 128 -- and the grid and the arguments
    follow: simulated here by refusing the larger blocks, the results are those of a launch at the
    smaller ones (o, lse bitwise; gradients within fp32 rounding of the other block order)."""
    from triton.runtime.errors import OutOfResources

    from refcheck.optimized.attention import backward as backward_module
    from refcheck.optimized.common import launch
    refuse = {"forward_kernel": ("BM", 128), "forward_persistent_kernel": ("BM", 128), "dq_kernel": ("BM", 128),
              "dkdv_kernel": ("BN", 128)}
    refused = []

    def gpu_without_room(kernel, grid, args, constexprs, ladder):
        name, big = kernel.fn.__name__, refuse[kernel.fn.__name__]
        fits = [step for step in ladder if step.get(big[0], constexprs.get(big[0])) != big[1]]
        refused.append((name, len(ladder) - len(fits)))
        if not fits:
            raise OutOfResources(1, 0, "shared memory")
        return launch(kernel, grid, args, constexprs, fits)
    x = attention_case(T=150, S=140, H=2, Hk=1, Dqk=32, Dv=16, dtype="fp32", lengths=((90, 60), (70, 70)))
    gen = torch.Generator().manual_seed(1)
    cot = (torch.randn(1, 150, 2, 16, generator=gen, dtype=torch.float64), torch.randn(1, 2, 150, generator=gen,
                                                                                      dtype=torch.float64))
    want = run(optimized.attention, x, cot, causal=True, block_m=64, schedule=schedule)
    for module in (forward_module, backward_module):
        monkeypatch.setattr(module, "launch", gpu_without_room)
    got = run(optimized.attention, x, cot, causal=True, block_m=128, schedule=schedule)
    assert {name for name, n in refused if n} == {"forward_persistent_kernel" if schedule == "persistent"
                                                  else "forward_kernel", "dq_kernel", "dkdv_kernel"}
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert all(rel(got[2][n], want[2][n]) < 1e-6 for n in "qkv")


def test_tma_only_where_descriptors_can_address_the_tensors():
    """TMA needs 16-byte rows: bf16 head dims that are multiples of 8, and no empty tensor."""
    aligned = common.tma_aligned
    assert aligned(torch.zeros(5, 2, 8, dtype=torch.bfloat16))
    assert not aligned(torch.zeros(5, 2, 12, dtype=torch.bfloat16))
    assert not aligned(torch.zeros(0, 2, 8, dtype=torch.bfloat16))
    assert not aligned(torch.zeros(5 * 2 * 8 + 1, dtype=torch.bfloat16)[1:].view(5, 2, 8))


@pytest.mark.parametrize("name", list(CASES))
def test_attention_matches_float64(name):
    shape, causal, knobs = CASES[name]
    errs = errors(attention_case(**shape), causal, **knobs)
    tol = TOL[(shape.get("dtype", "fp32"), knobs.get("precision", "tf32"))]
    assert all(e <= tol for e in errs.values()), errs


@triton.jit
def top_left_visible(i, j, Tq, Sk, left, right, LEFT: tl.constexpr, RIGHT: tl.constexpr):
    """The classic bug: the causal mask aligned top-left (``j <= i``), right only when S == T."""
    return (i < Tq) & (j < Sk) & (j <= i)


def test_top_left_causal_mask_is_caught(monkeypatch):
    """A forward with ``top_left_visible`` is far off the reference with more keys than queries."""
    monkeypatch.setattr(forward_module, "visible", top_left_visible)
    x = attention_case(T=8, S=24, Dqk=16, Dv=16)
    o, _ = optimized.attention(**x, causal=True)
    ro, _ = references.attention(**{n: t.double() for n, t in x.items()}, causal=True)
    assert rel(o, ro) > 0.1


def _bad(**change):
    x = attention_case(T=8, S=8) | change
    with pytest.raises(ValueError) as err:
        optimized.attention(**x)
    return str(err.value)


@pytest.mark.parametrize("change, name", [
    (dict(q=torch.randn(1, 8, 2, 300), k=torch.randn(1, 8, 1, 300)), "q"),
    (dict(v=torch.randn(1, 8, 1, 257)), "v"),
    (dict(q=torch.randn(1, 8, 3, 32), k=torch.randn(1, 8, 2, 32), v=torch.randn(1, 8, 2, 32)), "k"),
    (dict(cu_seqlens_q=torch.tensor([0, 8])), "cu_seqlens_q"),
    (dict(cu_seqlens_q=torch.tensor([0, 3, 8]), cu_seqlens_k=torch.tensor([0, 8])), "cu_seqlens_k"),
    (dict(k=torch.randn(1, 8, 1, 32).half()), "k"),
    (dict(q=torch.randn(1, 8, 2, 32).double()), "q"),
    (dict(precision="fp64"), "precision"),
    (dict(block_m=32), "block_m"),
    (dict(schedule="stream-k"), "schedule"),
    (dict(causal=1), "causal"),
    (dict(scale=-1.0), "scale"),
])
def test_attention_bad_input_names_the_argument(change, name):
    assert name in _bad(**change)


@pytest.mark.parametrize("fp8, dims, lengths, causal, schedule", [
    ("fp8e4m3", dict(B=2, T=40, S=50, H=4, Hk=2, Dqk=192, Dv=128), None, True, "grid"),
    ("fp8e5m2", dict(B=2, T=40, S=50, H=4, Hk=2, Dqk=192, Dv=128), None, False, "grid"),
    ("fp8e4m3", dict(B=2, T=40, S=50, H=4, Hk=2, Dqk=192, Dv=128), None, False, "persistent"),
    ("fp8e5m2", dict(B=1, T=45, S=45, H=3, Hk=1, Dqk=64, Dv=64), ((13, 0, 27, 5), (20, 5, 20, 0)), True, "grid"),
])
def test_fp8_forward_within_budgets(fp8, dims, lengths, causal, schedule):
    """fp8 q, k, v holding ``x / descale`` per tensor (``fp8_inputs``): o (bf16) and lse against float64
    on the values they hold, within our guards ``[attention.{o,lse}.FP8.triton]`` of tolerances.toml;
    p is rounded to bf16 before ``p v``, and the fp8 ``q k^T`` accumulates with Hopper's fp8
    tensor-core precision."""
    seqlens, seqlens_k = lengths or (None, None)
    case = Case.make("attention", dims, fp8, 0, seqlens=seqlens, seqlens_k=seqlens_k, options={"causal": causal})
    kernel, held = fp8_inputs(case, "cpu")
    out = optimized.attention(**kernel, **case.opts, schedule=schedule)
    truth, naive = references.attention(**held, **case.opts), fp8_attention(held, **case.opts)
    assert out[0].dtype == torch.bfloat16 and torch.equal(torch.isneginf(out[1]), torch.isneginf(truth[1]))
    for name, got, want, yardstick in zip(("o", "lse"), out, truth, naive):
        budget = budgets.load().get("attention", name, fp8, DEFAULT_PRECISION, "triton")
        error, naive_error = rel_rms(got, want, budget.floor), rel_rms(yardstick, want, budget.floor)
        assert error <= budget.bound(naive_error), f"{name} error {error:.2e} > {budget.explain(naive_error, dtype='bf16')}"


def _fp8(**change):
    return {n: torch.randn(1, 8, h, 32).to(torch.float8_e4m3fn) for n, h in (("q", 2), ("k", 1), ("v", 1))} | change


@pytest.mark.parametrize("change, name", [
    (_fp8(), "q_descale"),
    (_fp8(q_descale=1.0, k_descale=1.0), "v_descale"),
    (_fp8(q_descale=1.0, k_descale=0.0, v_descale=1.0), "k_descale"),
    (_fp8(q_descale=1.0, k_descale=1.0, v_descale=1.0, q=torch.randn(1, 8, 2, 32).to(torch.float8_e4m3fn)
          .requires_grad_()), "q"),
    (_fp8(q_descale=1.0, k_descale=1.0, v_descale=1.0, v=torch.randn(1, 8, 1, 32).to(torch.float8_e5m2)), "v"),
    (dict(v_descale=1.0), "v_descale"),
])
def test_fp8_bad_input_names_the_argument(change, name):
    assert name in _bad(**change)


def test_precision_modes_give_no_verdict_where_no_query_sees_a_key():
    """An H100 law run's false alarm, replayed: fp32 attention whose only query row has
    an empty key span (and whose only keys have no query) computes o = 0, lse = -inf and zero gradients
    exactly in every precision mode. Law 8 has nothing to judge there: the example is rejected in a
    search, and here, run alone, it holds vacuously with a note (``Trial.vacuous``)."""
    from refcheck.engine.examples import Example
    from refcheck.engine.laws import check
    from refcheck.model import registry
    case = Case.make("attention", {"B": 1, "Dqk": 32, "Dv": 16, "H": 24, "Hk": 8, "S": 1, "T": 1}, "fp32", 0,
                     seqlens=[0, 1], seqlens_k=[1, 0], options={"causal": False, "scale": 0.1},
                     draw={"cu_dtype": "int64"})
    notes = check("precision_modes", registry.get("attention", "triton"),
                  Example(case, "tf32x3", {"block_m": 128}, {})).notes
    assert len(notes) == 1 and "no verdict" in notes[0], notes


@pytest.mark.parametrize("change, name", [
    (dict(window_size=(-1, None)), "window_size"),
    (dict(window_size=(3,)), "window_size"),
    (dict(softcap=0.0), "softcap"),
    (dict(sinks=torch.zeros(3)), "sinks"),
    (dict(sinks=torch.zeros(2, dtype=torch.float64)), "sinks"),
])
def test_extension_bad_input_names_the_argument(change, name):
    assert name in _bad(**change)


EXTENSION_CASES = {
    # (shape, options): GQA and packed sequences of other lengths, windows bounded on one side or both, causal
    "window_left_causal": (dict(B=2, T=70, S=90, H=4, Hk=2, Dqk=24, Dv=16), dict(causal=True, window_size=(9, None))),
    "window_both_sides": (dict(T=100, S=100, H=2, Hk=1, Dqk=16, Dv=16, lengths=((60, 40), (35, 65))),
                          dict(window_size=(5, 20))),
    "window_right_only": (dict(B=1, T=33, S=80, H=2, Hk=2, Dqk=16, Dv=8), dict(window_size=(None, 2))),
    "softcap": (dict(B=2, T=40, S=50, H=2, Hk=1, Dqk=32, Dv=16), dict(causal=True, softcap=3.0)),
    "sinks_rows_without_keys": (dict(B=2, T=50, S=20, H=4, Hk=1, Dqk=16, Dv=16), dict(causal=True, sinks=True)),
    "all_three": (dict(T=90, S=90, H=4, Hk=2, Dqk=16, Dv=32, lengths=((70, 20), (70, 20))),
                  dict(causal=True, window_size=(17, None), softcap=5.0, sinks=True)),
}


@pytest.mark.parametrize("name", list(EXTENSION_CASES))
def test_window_softcap_sinks_match_float64(name):
    """Windows, the softcap and sinks, forward (o, lse) and backward (dq, dk, dv and dsinks, through o and lse)
    at fp32 accuracy against float64 (precision "ieee"); rows that see no key keep lse = -inf, or their sink."""
    shape, options = EXTENSION_CASES[name]
    x = attention_case(**shape, seed=4)
    options = dict(options)
    if options.pop("sinks", False):
        x["sinks"] = 2 * torch.randn(shape["H"], generator=torch.Generator().manual_seed(5))
    leaves = [n for n in ("q", "k", "v", "sinks") if n in x]
    ours = {n: x[n].clone().requires_grad_() for n in leaves}
    truth = {n: x[n].double().requires_grad_() for n in leaves}
    rest = {n: t for n, t in x.items() if n not in leaves}
    o, lse = optimized.attention(**ours, **rest, **options, precision="ieee")
    ro, rlse = references.attention(**truth, **rest, **options)
    gen = torch.Generator().manual_seed(6)
    do, dlse = torch.randn(ro.shape, generator=gen, dtype=torch.float64), torch.randn(rlse.shape, generator=gen,
                                                                                     dtype=torch.float64)
    seen = torch.isfinite(rlse)
    assert torch.equal(torch.isfinite(lse), seen)
    grads = torch.autograd.grad((o.double() * do).sum() + (lse.double().where(seen, 0) * dlse).sum(), list(ours.values()))
    want = torch.autograd.grad((ro * do).sum() + (rlse.where(seen, 0) * dlse).sum(), list(truth.values()))
    errs = {"o": rel(o, ro), "lse": rel(lse[seen], rlse[seen])} | {f"d{n}": rel(g, w) for n, g, w in
                                                                   zip(leaves, grads, want)}
    assert all(e <= TOL[("fp32", "ieee")] for e in errs.values()), errs


def _law_fails(law: str, options: dict, params: dict | None = None) -> bool:
    """Whether ``law`` fails our kernel on one fp32 case with these options (precision "ieee")."""
    from refcheck.engine.laws import LawViolation
    from refcheck.engine.reproduce import law as run_law
    case = Case.make("attention", dict(B=1, T=40, S=48, H=2, Hk=1, Dqk=16, Dv=16), "fp32", 3,
                     options=options)
    try:
        run_law(law, "triton", case, mode="ieee", params=params)
    except LawViolation:
        return True
    return False


@triton.jit
def window_one_too_wide(i, j, Tq, Sk, left, right, LEFT: tl.constexpr, RIGHT: tl.constexpr):
    """A window whose left side reaches one key too far (``j >= d - left - 1``)."""
    ok = (i < Tq) & (j < Sk)
    if LEFT:
        ok = ok & (j >= i + (Sk - Tq) - left - 1)
    if RIGHT:
        ok = ok & (j <= i + (Sk - Tq) + right)
    return ok


@triton.jit
def softcap_without_its_derivative(s, cap_in, cap_out, SOFTCAP: tl.constexpr):
    """The softcapped scores, with the gradient passed through as if there were no tanh (factor 1)."""
    t = tl.sigmoid(2.0 * s * cap_in) * 2.0 - 1.0
    return t * cap_out, t * 0.0 + 1.0


def test_window_and_softcap_mutants_are_caught_by_their_laws(monkeypatch):
    """Our kernel with the window one key too wide fails window locality (law 16); with the softcap's
    derivative left out of the backward, agreement with float64 (law 1); unmutated, both hold."""
    from refcheck.optimized.attention import backward as backward_module
    window = dict(causal=True, window_size=(6, None))
    capped = dict(causal=True, softcap=2.0)
    row = {"row": 30}
    assert not _law_fails("window_locality", window, row) and not _law_fails("agreement", capped)
    with monkeypatch.context() as patch:
        for module in (forward_module, backward_module):
            patch.setattr(module, "visible", window_one_too_wide)
        assert _law_fails("window_locality", window, row)
    monkeypatch.setattr(backward_module, "softcapped", softcap_without_its_derivative)
    assert _law_fails("agreement", capped)
