"""Quick checks of ``optimized.kda`` / ``optimized.kda_gate`` on the CPU (faithful Triton interpreter)
against the float64 references: forward and every gradient, each option once, and bad input."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from refcheck.runtime import interpreter

interpreter.interpret_new_kernels()  # before the kernel modules are imported
interpreter.enable()

from refcheck import optimized, references  # noqa: E402
from refcheck.optimized.chunk.tiles import tf32_nearest  # noqa: E402 (the test's kernel calls it by its global name)
from tests.ladders import force_last_launch_steps  # noqa: E402

# relative RMS error allowed, by (input dtype, precision): fp32 inputs with fp32-accurate dots sit
# near 1e-6; tf32 truncates operands to 10 bits (~1e-3); bf16/fp16 round inputs/outputs.
TOL = {("fp32", "ieee"): 2e-5, ("fp32", "tf32x3"): 2e-5, ("fp32", "tf32"): 6e-3, ("bf16", "tf32"): 2e-2,
       ("fp16", "tf32"): 6e-3}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def front_flags(q, k, G, chunks):
    """The sub-chunks flagged for exact diagonal sums (``blocks.span_flags``), as the forward's front finds them before
    ``intra``, for tests that call ``intra`` alone."""
    from refcheck.optimized.kda.front import front
    return front(q, k, None, False, chunks, "tf32", False, G=G).flags


def rel(x, ref):
    return float((x.detach().double() - ref.detach()).norm() / ref.detach().norm().clamp_min(1e-30))


def kda_case(B=1, T=70, H=1, K=32, V=32, dtype="fp32", lengths=None, h0=False, gate=False, safe=None, l2=False,
             strong=False, decay=-5.0, seed=0):
    """Inputs (already rounded to dtype) and contract options of one kda call. ``strong``: the
    decay of tokens 24..55 is 30x stronger (up to -150 per token), so that in those sub-chunks the
    general path sums the diagonal blocks exactly and elsewhere takes the dots (``DIAG_SPAN``).
    The log-decays are uniform in ``[decay, 0]`` (``[lower_bound, 0]`` with safe_gate)."""
    gen = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    dt = DTYPES[dtype]
    cu = None if lengths is None else torch.tensor([0] + lengths).cumsum(0)
    N = B if lengths is None else len(lengths)
    k = rnd(B, T, H, K) if l2 else F.normalize(rnd(B, T, H, K), dim=-1)
    if gate:
        g = rnd(B, T, H, K)
    else:
        g = (safe or decay) * torch.rand(B, T, H, K, generator=gen)
        if strong:
            g[:, 24:56] *= 30.0
    x = dict(q=rnd(B, T, H, K), k=k, v=rnd(B, T, H, V), g=g, beta=torch.rand(B, T, H, generator=gen))
    x = {n: t.to(dt) for n, t in x.items()}
    if h0:
        x["initial_state"] = rnd(N, H, K, V)
    if gate:
        x["A_log"] = 0.5 * rnd(H)
        x["dt_bias"] = 0.5 * rnd(H * K)
    opts = dict(cu_seqlens=cu, output_final_state=True, use_qk_l2norm=l2, use_gate_in_kernel=gate,
                safe_gate=safe is not None, lower_bound=safe)
    return x, opts


def run_kda(fn, x, opts, do, dht, **knobs):
    leaves = {n: t.detach().clone().requires_grad_() for n, t in x.items()}
    o, ht = fn(**leaves, **opts, **knobs)
    grads = torch.autograd.grad((o, ht), list(leaves.values()), (do.to(o.dtype), dht.to(ht.dtype)))
    return o, ht, dict(zip(leaves, grads))


CASES = {
    "fp32 ieee general": (dict(T=130), dict(precision="ieee")),
    "fp32 ieee general strong decay": (dict(T=130, strong=True), dict(precision="ieee")),
    "fp32 tf32 general strong decay gather": (dict(T=100, strong=True), dict(precision="tf32", use_gather=True)),
    # strong decay in partial chunks (tokens 24..39 end the first sequence, 40..55 open the second): their last
    # sub-chunks are partial too
    "fp32 ieee varlen strong decay partial chunks": (dict(T=100, lengths=[40, 60], strong=True), dict(precision="ieee")),
    "fp32 tf32x3 safe gather": (dict(safe=-5.0), dict(precision="tf32x3", use_gather=True)),
    "fp32 ieee varlen empty h0 keep": (dict(T=110, lengths=[0, 37, 0, 73], h0=True),
                                       dict(precision="ieee", disable_recompute=True)),
    "fp32 ieee l2norm gather": (dict(l2=True), dict(precision="ieee", use_gather=True)),
    "fp32 ieee softplus gate": (dict(gate=True, h0=True, K=16, V=16), dict(precision="ieee")),
    "fp32 ieee sigmoid gate safe": (dict(gate=True, safe=-2.0), dict(precision="ieee")),
    "fp32 ieee K=100 V=24": (dict(T=66, K=100, V=24), dict(precision="ieee")),
    # K = 256: the prepared operands' two scale blocks of 128 under the passes' four state blocks of 64
    "bf16 tf32 K=256 h0": (dict(T=80, dtype="bf16", h0=True, K=256, V=32), dict()),
    "fp32 tf32 safe": (dict(safe=-5.0), dict(precision="tf32")),
    "bf16 tf32 B=2": (dict(B=2, T=40, dtype="bf16", h0=True, K=16, V=16), dict()),
    "fp16 tf32 safe": (dict(T=67, dtype="fp16", safe=-3.0), dict()),
    # the serial passes over segments (``chunk.segments``), under a decay weak enough that a chunk's state
    # reaches the next segment (about e^-1.6 per chunk)
    "fp32 ieee varlen empty h0 segments of 1": (dict(T=200, lengths=[0, 37, 0, 100, 63], h0=True, K=16, V=24,
                                                     decay=-0.05), dict(precision="ieee", segment_chunks=1)),
    "bf16 tf32 B=2 segments of 2": (dict(B=2, T=200, dtype="bf16", h0=True, K=16, V=16, decay=-0.05),
                                    dict(segment_chunks=2)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_kda_matches_float64(name):
    check_against_float64(name)


@pytest.mark.parametrize("name", ["fp32 ieee varlen strong decay partial chunks", "fp32 ieee K=100 V=24",
                                  "fp32 tf32 safe", "bf16 tf32 B=2 segments of 2"])
def test_launch_ladders_fall_back_to_the_same_result(name, monkeypatch):
    """Every launch of the op forced onto its ladder's last step (``tests.ladders``: where shared memory runs short of
    the earlier ones) still matches float64: grids and arrays sized by block widths follow the step that runs."""
    force_last_launch_steps(monkeypatch)
    check_against_float64(name)


def check_against_float64(name):
    """``CASES[name]`` forward and backward against the float64 reference, within ``TOL``."""
    shape, knobs = CASES[name]
    x, opts = kda_case(**shape)
    o_shape = (*x["v"].shape,)
    gen = torch.Generator().manual_seed(1)
    do = torch.randn(o_shape, generator=gen, dtype=torch.float64)
    N = x["q"].shape[0] if opts["cu_seqlens"] is None else len(opts["cu_seqlens"]) - 1
    dht = torch.randn(N, x["q"].shape[2], x["q"].shape[3], x["v"].shape[3], generator=gen, dtype=torch.float64)
    o, ht, grads = run_kda(optimized.kda, x, opts, do, dht, **knobs)
    x64 = {n: t.double() for n, t in x.items()}
    ro, rht, rgrads = run_kda(references.kda, x64, opts, do, dht)
    assert o.dtype == x["q"].dtype and o.shape == ro.shape
    assert ht.dtype == torch.float32
    tol = TOL[(shape.get("dtype", "fp32"), knobs.get("precision", "tf32"))]
    errors = {"o": rel(o, ro), "final_state": rel(ht, rht)} | {f"d{n}": rel(grads[n], rgrads[n]) for n in grads}
    # A_log gets one number per head: a sum over every token with cancellation, so looser
    limits = {n: (10 * tol if n == "dA_log" else tol) for n in errors}
    assert all(errors[n] <= limits[n] for n in errors), errors


@pytest.mark.parametrize("precision", ["ieee", "tf32x3"])
def test_log_decay_spikes_keep_fp32_accuracy(precision):
    """fp32, log-decays of -1000 at half the steps (the chunk's cumulative gate reaches ``|G| ~ 3e4``,
    where one fp32 ulp is 2e-3): every output within 10x the error of the chunked reference in fp32 whose
    exponents are each summed from their own start ("stable"), the accuracy the fp32 budgets ask for.
    The kernels take ``exp(G_i - G_j)`` of differences of fp64 cumulative gates for fp32 inputs
    (``chunk.tiles.cumulative_gate_dtype``). With fp32 ones ours erred o 1.7e-4 and dg 3.9e-4 here in
    both modes, and GPU law runs failed "agreement" at T=6 (o 1.15e-5, dq 1.65e-5 against guards of 1e-5,
    H200, results as of 11ac91e) and "state_chaining" at T=5 (o 1.39e-5, dq 1.72e-5, H100, results as of
    dab18c5). Measured now: o 8.2e-8 (ieee) and
    1.4e-7 (tf32x3), at most 9.0e-7 (dg, tf32x3), where the stable reference errs 4.7e-8 to 1.2e-7. A
    kernel running tf32 where ieee was asked fails it by orders of magnitude."""
    gen = torch.Generator().manual_seed(0)
    T, H, K, V = 150, 1, 32, 16
    q, v = torch.randn(1, T, H, K, generator=gen), torch.randn(1, T, H, V, generator=gen)
    k = F.normalize(torch.randn(1, T, H, K, generator=gen), dim=-1)
    g = -torch.rand(1, T, H, K, generator=gen)
    g = torch.where(torch.rand(1, T, H, K, generator=gen) < 0.5, torch.full_like(g, -1000.0), g)
    x = dict(q=q, k=k, v=v, g=g, beta=torch.rand(1, T, H, generator=gen))
    opts = dict(cu_seqlens=None, output_final_state=True)
    do, dht = torch.randn(1, T, H, V, generator=gen), torch.randn(1, H, K, V, generator=gen)

    def outputs(fn, inputs, **knobs):
        o, ht, grads = run_kda(fn, inputs, opts, do, dht, **knobs)
        return [o, ht, *grads.values()]

    truth = outputs(references.kda, {n: t.double() for n, t in x.items()})
    stable = outputs(references.kda_chunked, x, decays="stable")
    ours = outputs(optimized.kda, x, precision=precision)
    errors = {n: (rel(got, t), rel(st, t)) for n, got, st, t in
              zip(("o", "final_state", "dq", "dk", "dv", "dg", "dbeta"), ours, stable, truth)}
    assert all(e <= 10 * max(st, 1e-8) for e, st in errors.values()), errors


def test_segments_agree_with_one_pass():
    """The passes over segments of one chunk give what one pass over each sequence gives, to fp32's
    rounding (a transition matrix and a scan instead of the steps)."""
    x, opts = kda_case(T=200, lengths=[0, 37, 0, 100, 63], h0=True, K=16, V=24, decay=-0.05)
    gen = torch.Generator().manual_seed(1)
    do, dht = torch.randn(1, 200, 1, 24, generator=gen), torch.randn(5, 1, 16, 24, generator=gen)
    runs = [run_kda(optimized.kda, x, opts, do, dht, precision="ieee", segment_chunks=n) for n in (0, 1)]
    (o, ht, grads), (so, sht, sgrads) = runs
    errors = {"o": rel(so, o.double()), "final_state": rel(sht, ht.double())}
    errors |= {f"d{n}": rel(sgrads[n], grads[n].double()) for n in grads}
    assert max(errors.values()) < 1e-6, errors
    # the inputs make the check sensitive: the initial state still moves o in the second chunk of the
    # 100-token sequence (tokens 101..136), a segment that starts from the scan's state
    o0 = optimized.kda(**(x | dict(initial_state=torch.zeros_like(x["initial_state"]))), **opts, precision="ieee",
                       segment_chunks=1)[0]
    assert rel(o0[:, 101:137], o[:, 101:137].double()) > 1e-2


@pytest.mark.parametrize("decay, strong", [(-0.05, False), (-5.0, True)])
def test_sequence_groups_give_the_bits_of_one_pass(monkeypatch, decay, strong):
    """The backward runs the long sequences' passes and the others' as launches of their own (``state.sequence_groups``),
    each group's gradients after its own passes: every gradient (dh0 among them) bitwise those of one launch each (o
    and the final state, of the forward's one pass, alike), with empty sequences (their final state is h0), partial
    chunks, a long sequence after the short ones, and under strong decay flagged chunks (the gradients' exact diagonal
    blocks). The groups split the sequences and their chunks, each in order: long, more than half the
    longest's chunks (6 here: 4 and 6 are long, 3 is not)."""
    from refcheck.optimized.chunk import state
    from refcheck.optimized.common import make_chunks
    lengths = [37, 0, 200, 0, 330, 150]  # strong decay on tokens 24..55: in a short sequence and in a long one
    x, opts = kda_case(T=sum(lengths), lengths=lengths, h0=True, K=16, V=16, decay=decay, strong=strong)
    chunks = make_chunks(1, sum(lengths), opts["cu_seqlens"], 64, "cpu")
    long, short = state.sequence_groups(chunks)
    assert long.seqs.tolist() == [2, 4] and short.seqs.tolist() == [0, 1, 3, 5]
    assert long.chunks.tolist() == list(range(1, 11)) and short.chunks.tolist() == [0, 11, 12, 13]
    assert state.sequence_groups(chunks) is state.sequence_groups(chunks)  # kept for the chunk table
    assert state.sequence_groups(make_chunks(2, 640, None, 64, "cpu")) is None  # all as long as the longest
    gen = torch.Generator().manual_seed(2)
    do, dht = torch.randn(1, sum(lengths), 1, 16, generator=gen), torch.randn(6, 1, 16, 16, generator=gen)
    grouped = run_kda(optimized.kda, x, opts, do, dht, precision="tf32")
    from refcheck.optimized.kda import api
    monkeypatch.setattr(api, "sequence_groups", lambda chunks: None)
    one = run_kda(optimized.kda, x, opts, do, dht, precision="tf32")
    assert torch.equal(grouped[0], one[0]) and torch.equal(grouped[1], one[1])
    assert all(torch.equal(grouped[2][n], one[2][n]) for n in one[2])
    assert torch.equal(grouped[1][1], x["initial_state"][1])  # the empty sequence's
    assert one[1][2].abs().max() > 0 and not torch.equal(one[1][2], x["initial_state"][2])  # not a state left behind


@pytest.mark.parametrize("block", [64, 128])
def test_prepared_operands_have_power_of_two_row_scales(block):
    """The forward pass takes the row scales of its prepared operands into its dots' first operand (``s X``,
    ``state.rows_dot``): exact only where s is a power of two. X keeps fp16's range, each row's largest
    magnitude in a scale block (``block`` columns) in [1/2, 1], and ``s X`` is ``k e^G`` to fp16's rounding
    at the row's scale. Rows that decay below fp32's normal range take 2^-126, rows of zeros 1."""
    from refcheck.optimized.chunk.prepared import prepare_keys
    from refcheck.optimized.common import make_chunks
    from refcheck.optimized.kda.gate import gate_cumsum
    gen = torch.Generator().manual_seed(3)
    T, H, K = 100, 2, 128
    k = 3 * torch.randn(T, H, K, generator=gen)
    chunks = make_chunks(1, T, None, 64, "cpu")
    g = -2 * torch.rand(T, H, K, generator=gen)
    g[20, 0, :] = -70.0  # later rows of the first chunk decay below fp32's smallest normal, then to zero
    g[20, 0, 64:] += 8.0  # the second half of the channels decays less there: its rows reach subnormals later
    G = gate_cumsum(g, None, None, None, chunks)
    keys = prepare_keys(k, G, chunks, "tf32", config=dict(SB=block))
    assert keys.block == block and keys.sg.shape == (T, H, K // block)
    X, s = keys.kg.float().view(T, H, -1, block), keys.sg
    largest = (k * G.exp()).view(T, H, -1, block).abs().amax(-1)
    normal, zero = largest >= 2.0 ** -126, largest == 0
    assert 0 < int(zero.sum()) < int((~normal).sum())  # some rows subnormal, some zero
    assert bool(torch.isfinite(X).all())
    assert torch.equal(s, torch.exp2(torch.log2(s).round()))
    assert bool((s[~normal & ~zero] == 2.0 ** -126).all()) and bool((s[zero] == 1).all())
    peak = X.abs().amax(-1)[normal]
    assert bool(((peak >= 0.5) & (peak <= 1)).all()), peak  # 1/2 where a row's largest rounds down to it
    error = (s[..., None] * X - (k * G.exp()).view(T, H, -1, block)).abs()
    assert bool((error <= s[..., None] * 2.0 ** -11).all())  # half an fp16 step of 1 at the row's scale


def test_backward_intermediates_are_row_scaled_fp16_under_tf32():
    """Under "tf32" the backward's recomputed h and U and its dh and dY are stored as fp16 X and power-of-two row
    scales s per writer's value block (``chunk.scaled``): ``s X`` is the fp32 value to fp16's rounding at the row's
    scale, each row's largest magnitude in a block in [1/2, 1], a zero row (h of a first chunk) scaled by 1."""
    from refcheck.optimized.chunk.prepared import prepare_keys
    from refcheck.optimized.common import make_chunks
    from refcheck.optimized.kda.chunk_bwd import dstate
    from refcheck.optimized.kda.chunk_fwd import intra, recurrence
    from refcheck.optimized.kda.gate import gate_cumsum
    gen = torch.Generator().manual_seed(5)
    T, H, K, V = 150, 2, 32, 48
    q, k = (F.normalize(torch.randn(T, H, K, generator=gen), dim=-1) for _ in range(2))
    v, do = 3 * torch.randn(T, H, V, generator=gen), torch.randn(T, H, V, generator=gen)
    beta = torch.rand(T, H, generator=gen)
    chunks = make_chunks(1, T, None, 64, "cpu")
    G = gate_cumsum(-torch.rand(T, H, K, generator=gen), None, None, None, chunks)
    Tm, P = intra(q, k, G, beta, chunks, K ** -0.5, front_flags(q, k, G, chunks), "tf32")
    keys = prepare_keys(k, G, chunks, "tf32", q=q)
    stored = {}
    for scaled in (False, True):
        _, hs, U, _ = recurrence(keys, v, G, beta, Tm, None, chunks, "tf32", final=False, scaled=scaled)
        dh, dY, _ = dstate(keys, G, beta, Tm, P, do, None, chunks, K ** -0.5, "tf32", False, scaled=scaled)
        stored[scaled] = dict(hs=hs, U=U, dh=dh, dY=dY)
    for name, x in stored[True].items():
        exact = stored[False][name].float()
        assert x.data.dtype == torch.float16 and not stored[False][name].scaled
        s = x.scales.repeat_interleave(x.block, -1)[..., :exact.shape[-1]]
        assert torch.equal(x.scales, torch.exp2(torch.log2(x.scales).round()))
        assert bool(((x.float() - exact).abs() <= s * 2.0 ** -11).all()), name  # half an fp16 step at the row's scale
        blocks = exact.split(x.block, -1)
        peak = torch.stack([b.abs().amax(-1) for b in blocks], -1)
        assert bool(((peak <= x.scales) & ((peak > x.scales / 2) | (peak == 0))).all()), name
    assert bool((stored[True]["hs"].scales[0] == 1).all())  # the first chunk's state is zero


def tf32_model(x: torch.Tensor, nearest: bool) -> torch.Tensor:
    """fp32 x as a "tf32" dot takes it, in float64: rounded to nearest at 11 significant bits first (ties away,
    ``tiles.tf32_nearest``) or truncated by the tensor core; the interpreter's calibrated models of both."""
    model = interpreter._tf32_round_away if nearest else interpreter._tf32_truncate
    return torch.from_numpy(model(x.float().contiguous().numpy())).double()


def test_tf32_nearest_is_cvt_rna_and_keeps_inf_and_nan():
    """``tiles.tf32_nearest`` gives the bits of ``cvt.rna.tf32.f32`` (the interpreter's calibrated model) on random
    values, ties, the largest finite (which rounds to Inf), Inf, and NaNs whose payload would carry past the mantissa
    (0x7FFFFFFF: + 0x1000 would make it -0.0); under "ieee" it leaves x as it is."""
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(x_ptr, y_ptr, N: tl.constexpr, PREC: tl.constexpr):
        i = tl.arange(0, N)
        tl.store(y_ptr + i, tf32_nearest(tl.load(x_ptr + i), PREC))
    gen = torch.Generator().manual_seed(3)
    special = torch.tensor([0x7FFFFFFF, -1, 0x7F800000, 0xFF800000 - (1 << 32), 0x7F7FFFFF, 0x3F801000, 0x3F803000,
                            0x00001000, 0], dtype=torch.int64).to(torch.int32).view(torch.float32)
    x = torch.cat([torch.randn(55, generator=gen) * 10.0 ** torch.randint(-30, 30, (55,), generator=gen), special])
    for prec in ("tf32", "ieee"):
        y = torch.empty_like(x)
        kernel[(1,)](x, y, N=64, PREC=prec)
        want = interpreter._tf32_round_away(x.numpy()) if prec == "tf32" else x.numpy()
        assert torch.equal(y.view(torch.int32), torch.from_numpy(want).view(torch.int32)), prec


def half_state_model(S: torch.Tensor, BV: int) -> torch.Tensor:
    """S ``[H, K, V]`` as the forward pass's dots take it (``state.half_state``), in float64: each value block of BV
    columns over the power of two p at or above its largest magnitude, rounded to fp16, times p."""
    out = torch.empty_like(S, dtype=torch.float64)
    for c in range(0, S.shape[2], BV):
        blk = S[:, :, c:c + BV].double()
        m = blk.abs().amax(dim=(1, 2), keepdim=True)
        p = torch.where(m > 0, 2.0 ** torch.ceil(torch.log2(m.clamp_min(2.0 ** -126))), 1.0)
        out[:, :, c:c + BV] = (blk / p).to(torch.float16).double() * p
    return out


@pytest.mark.parametrize("block, unit_rows", [(16, False), (32, False), (64, False), (32, True)])
def test_forward_pass_output_is_its_operands_products(block, unit_rows):
    """The forward's output formed in its serial pass (``chunk_fwd.recurrence``'s ``output``), ``O = scale Qg S0 + P
    U`` of every chunk, against float64 products of the operands as the pass's dots take them: Qg prepared (fp16, row
    scales), the entry state S0 in fp16 over a power of two a value block (``half_state_model``), P and
    U rounded to nearest at "tf32" first (``tiles.tf32_nearest``; truncated, o's error against float64 grew from
    1.17e-3 to 1.78e-3 on an H200, fp32 inputs). Within fp32 accumulation of them, so that a truncated P or U, or a
    state rounded otherwise, fails it; states from 1e-6 to 2e5 (fp16 ends at 65504: without its power of two a state
    overflows or sinks into fp16's subnormals); packed sequences with partial and empty chunks, two state
    blocks (K = 128), value blocks of 16, 32 and 64 (V = 48: the last one partial), h and U stored alongside
    (``states``) as ``disable_recompute`` stores them; with ``unit_rows`` P in fp16 (``chunk_fwd.p_dtype``), whose
    values the "tf32" rounding keeps."""
    from refcheck.optimized.chunk.prepared import prepare_keys
    from refcheck.optimized.common import make_chunks
    from refcheck.optimized.kda.chunk_fwd import intra, recurrence, state_width
    from refcheck.optimized.kda.gate import gate_cumsum
    gen = torch.Generator().manual_seed(7)
    lengths, H, K, V, C = [37, 0, 100], 2, 128, 48, 64
    T, scale = sum(lengths), K ** -0.5
    q, k = (F.normalize(torch.randn(T, H, K, generator=gen), dim=-1) for _ in range(2))
    v = torch.randn(T, H, V, generator=gen)
    beta = torch.rand(T, H, generator=gen)
    h0 = torch.randn(len(lengths), H, K, V, generator=gen) * torch.tensor([2e5, 1.0, 1e-6])[:, None, None, None]
    chunks = make_chunks(1, T, torch.tensor([0] + lengths).cumsum(0), C, "cpu")
    G = gate_cumsum(-torch.rand(T, H, K, generator=gen), None, None, None, chunks)
    keys = prepare_keys(k, G, chunks, "tf32", q=q)
    Tm, P = intra(q, k, G, beta, chunks, scale, front_flags(q, k, G, chunks), "tf32", unit_rows=unit_rows)
    assert P.dtype == (torch.float16 if unit_rows else torch.float32)
    o = torch.full_like(v, float("nan"))
    _, hs, U, _ = recurrence(keys, v, G, beta, Tm, h0, chunks, "tf32", final=False, config=dict(BV=block),
                             output=(P, o, scale))
    assert not (hs.scaled or U.scaled) and bool(o.isfinite().all())
    assert keys.state_rows(state_width(False)) < K  # two state blocks, one power of two
    Qg = keys.qg.double() * keys.sq.double()  # one scale block (K <= SCALE_BLOCK)
    for c in range(chunks.num_chunks):
        t0 = int(chunks.start[c])
        n = min(int(chunks.cu[int(chunks.seq[c]) + 1]) - t0, C)
        rows = slice(t0, t0 + n)
        S = hs.data[c]  # [H, K, V]
        Qc, Pc, Uc = Qg[rows].transpose(0, 1), P[rows, :, :n].transpose(0, 1), U.data[rows].transpose(0, 1)
        model = scale * Qc @ half_state_model(S, block) + tf32_model(Pc, True) @ tf32_model(Uc, True)
        size = scale * Qc.abs() @ S.double().abs() + Pc.double().abs() @ Uc.double().abs()
        assert torch.equal(tf32_model(Uc, True), Uc.double())  # U as stored: rounded already
        assert bool(((o[rows].transpose(0, 1).double() - model).abs() <= 2.0 ** -20 * size).all()), c


def test_serial_passes_read_a_row_scaled_t_as_its_values():
    """``intra`` stores T row-scaled in fp16 under "tf32" (``blocks.store_t_rows``: one scale a row, at least 1 where
    the diagonal's 1 is the largest entry), and the serial passes read it as ``X s`` (``scaled.load_rows_scaled``).
    With rows scaled by powers of two from 2^-3 to 2^6, so that the scales matter: the forward pass (h, U, o, the final
    state) and the reverse pass (dh, dY, dh0) bitwise those of the same values stored in fp32."""
    from refcheck.optimized.chunk.prepared import prepare_keys
    from refcheck.optimized.chunk.scaled import Stored
    from refcheck.optimized.common import make_chunks
    from refcheck.optimized.kda.chunk_bwd import dstate
    from refcheck.optimized.kda.chunk_fwd import intra, recurrence
    from refcheck.optimized.kda.gate import gate_cumsum
    gen = torch.Generator().manual_seed(5)
    lengths, H, K, V = [37, 0, 100], 2, 32, 32
    T = sum(lengths)
    q, k = (F.normalize(torch.randn(T, H, K, generator=gen), dim=-1) for _ in range(2))
    v, do = (torch.randn(T, H, V, generator=gen) for _ in range(2))
    beta = torch.rand(T, H, generator=gen)
    h0, dht = (torch.randn(len(lengths), H, K, V, generator=gen) for _ in range(2))
    chunks = make_chunks(1, T, torch.tensor([0] + lengths).cumsum(0), 64, "cpu")
    G = gate_cumsum(-torch.rand(T, H, K, generator=gen), None, None, None, chunks)
    Tm, P = intra(q, k, G, beta, chunks, K ** -0.5, front_flags(q, k, G, chunks), "tf32")
    assert Tm.scaled and Tm.data.dtype == torch.float16 and bool((Tm.scales >= 1).all())
    Tm = Stored(Tm.data, Tm.scales * 2.0 ** torch.randint(-3, 7, Tm.scales.shape, generator=gen), Tm.block)
    keys = prepare_keys(k, G, chunks, "tf32", q=q)
    runs = []
    for t in (Tm, Stored(Tm.float())):
        o = torch.full_like(v, float("nan"))
        ht, hs, U, _ = recurrence(keys, v, G, beta, t, h0, chunks, "tf32", final=True, output=(P, o, K ** -0.5))
        dh, dY, dh0 = dstate(keys, G, beta, t, P, do, dht, chunks, K ** -0.5, "tf32", True)
        runs.append([ht, hs.data, U.data, o, dh.data, dY.data, dh0])
    for x, y in zip(*runs):
        assert torch.equal(x, y)


@pytest.mark.parametrize("dtype, K, l2", [(torch.bfloat16, 32, True), (torch.float32, 32, True),
                                         (torch.bfloat16, 256, True), (torch.bfloat16, 100, False),
                                         (torch.float16, 64, False)])
def test_front_gives_the_bits_of_its_separate_steps(dtype, K, l2):
    """The forward's front (``kda.front``) forms in one kernel q and k normalized and what ``prepare_keys`` forms apart
    from them, k's operands and the output's left operand ``q e^G``: packed sequences with partial and empty chunks,
    decay strong enough to underflow (into fp16's subnormals), bf16, fp16 and fp32 (fp64 G), K padded and of two scale
    blocks (where a row's norm spans both). q and k are ``x / sqrt(sum x^2 + eps)`` to their rounding, the operands and
    their row scales bitwise those that ``prepare_keys`` forms from the front's q and k."""
    from refcheck.optimized.chunk.prepared import prepare_keys
    from refcheck.optimized.chunk.tiles import cumulative_gate_dtype
    from refcheck.optimized.common import make_chunks
    from refcheck.optimized.kda.front import front
    from refcheck.optimized.kda.gate import gate_cumsum
    from refcheck.optimized.kda.l2norm import EPS
    gen = torch.Generator().manual_seed(17)
    lengths, H = [37, 0, 100, 70], 2
    T = sum(lengths)
    q, k = (3 * torch.randn(T, H, K, generator=gen).to(dtype) for _ in range(2))
    if not l2:
        q, k = (F.normalize(x.float(), dim=-1).to(dtype) for x in (q, k))
    chunks = make_chunks(1, T, torch.tensor([0] + lengths).cumsum(0), 64, "cpu")
    g = -10 * torch.rand(T, H, K, generator=gen)
    # fp32 inputs: G (fp64) from the gate's kernel; 16-bit: the front's own
    G = gate_cumsum(g, None, None, None, chunks, dtype=torch.float64) if cumulative_gate_dtype(dtype) == torch.float64 \
        else None
    qn, kn, keys, G, _ = front(q, k, g, l2, chunks, "tf32", True, G=G)
    if l2:
        for mine, x in ((qn, q), (kn, k)):  # one rounding to dtype after a few fp32 ones
            x = x.double()
            torch.testing.assert_close(mine.double(), x / (x.square().sum(-1, keepdim=True) + EPS).sqrt(),
                                       rtol=torch.finfo(dtype).eps / 2 + 8 * 2.0 ** -24, atol=0)
    else:
        assert qn is q and kn is k
    assert keys.qg is not None and bool((keys.qg == 0).any())  # q e^G underflowed somewhere
    for x, y in zip(keys, prepare_keys(kn, G, chunks, "tf32", q=qn)):
        assert torch.equal(x, y)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_the_fronts_cumulative_gate_is_within_three_ulps_of_the_exact_sums(dtype):
    """The front's G (``front.store_chunk_gate``, ``gate.chunk_cumsum``: tensor-core products with a triangle of ones,
    an fp32 g in three bf16 parts) is each chunk's cumulative sum of g within three fp32 ulps of the float64 sums (the
    tensor core's truncated sums modelled as an H200's by the interpreter), as a sequential fp32 sum is: on log-decays
    spanning four decades (where a sum loses the low bits of its small terms), packed sequences with partial and empty
    chunks, the front's largest errors are 1.6, 2.5 and 2.2 ulps for bf16, fp16 and fp32 g, a sequential sum's 1.5,
    3.0 and 6.2."""
    from refcheck.optimized.common import make_chunks
    from refcheck.optimized.kda.front import front
    gen = torch.Generator().manual_seed(29)
    lengths, H, K = [70, 0, 100, 7], 2, 64
    T = sum(lengths)
    starts = torch.tensor([0] + lengths).cumsum(0)
    chunks = make_chunks(1, T, starts, 64, "cpu")
    g = (-torch.rand(T, H, K, generator=gen) * 10.0 ** torch.randint(-3, 1, (T, H, K), generator=gen)).to(dtype)
    q, k = (torch.randn(T, H, K, generator=gen).to(torch.bfloat16) for _ in range(2))
    G = front(q, k, g, True, chunks, "tf32", True).G
    exact = torch.empty(T, H, K, dtype=torch.float64)
    for s, e in zip(starts[:-1].tolist(), starts[1:].tolist()):
        for t0 in range(s, e, 64):
            exact[t0:min(t0 + 64, e)] = g[t0:min(t0 + 64, e)].double().cumsum(0)
    ulp = 2.0 ** (torch.floor(torch.log2(exact.abs().clamp_min(2.0 ** -126))) - 23)
    assert bool(((G.double() - exact).abs() <= 3 * ulp).all())


@pytest.mark.parametrize("precision", ["tf32", "ieee"])
def test_serial_passes_give_the_bits_of_pointer_loads_through_tma(precision):
    """The serial passes and the gradients' state terms read their row blocks (prepared operands, v, T, P, the
    output's ``scale q e^G``; U, dY, dO) and states through TMA descriptors wherever the tensors allow
    (``common.tma_operands``): a block at a sequence's end then holds the next sequence's rows, which beta's, the row
    scales' and k's zeros must drop, or which reach only rows that are not stored. Packed sequences with partial and
    empty chunks, an initial state and dht: hs, U, the forward's o, the final state, dh, dY, dh0 and every gradient
    are bitwise those of pointer loads."""
    from refcheck.optimized.chunk.prepared import prepare_keys
    from refcheck.optimized.chunk.scaled import row_scaled
    from refcheck.optimized.common import make_chunks, tma_operands
    from refcheck.optimized.kda.chunk_bwd import dstate, grads
    from refcheck.optimized.kda.chunk_fwd import intra, recurrence
    from refcheck.optimized.kda.gate import gate_cumsum
    gen = torch.Generator().manual_seed(9)
    lengths, H, K, V = [37, 0, 100, 70], 2, 32, 32
    T = sum(lengths)
    q, k = (F.normalize(torch.randn(T, H, K, generator=gen), dim=-1) for _ in range(2))
    v, do = (torch.randn(T, H, V, generator=gen).to(torch.bfloat16) for _ in range(2))
    beta = torch.rand(T, H, generator=gen)
    h0, dht = (torch.randn(len(lengths), H, K, V, generator=gen) for _ in range(2))
    chunks = make_chunks(1, T, torch.tensor([0] + lengths).cumsum(0), 64, "cpu")
    g = -torch.rand(T, H, K, generator=gen)
    G = gate_cumsum(g, None, None, None, chunks)
    flags = front_flags(q, k, G, chunks)
    Tm, P = intra(q, k, G, beta, chunks, K ** -0.5, flags, precision)
    keys = prepare_keys(k, G, chunks, precision, q=q)
    assert tma_operands(None, *((x, [64, 1, 32]) for x in (keys.kg, v, do)), (Tm.data, [64, 1, 64]))[0]
    runs = []
    for tma in (True, False):
        ht, hs, U, _ = recurrence(keys, v, G, beta, Tm, h0, chunks, precision, final=True,
                                  scaled=row_scaled(precision), config=dict(TMA=tma))
        o = torch.full_like(v, float("nan"))  # the forward's pass with its output, as the forward runs it
        recurrence(keys, v, G, beta, Tm, h0, chunks, precision, final=False, config=dict(TMA=tma),
                   output=(P, o, K ** -0.5), states=False)
        dh, dY, dh0 = dstate(keys, G, beta, Tm, P, do, dht, chunks, K ** -0.5, precision, True,
                             scaled=row_scaled(precision), config=dict(TMA=tma))
        dx = grads(q, k, v, g, G, beta, hs, dh, U, dY, do, None, None, None, chunks, K ** -0.5, flags, False, precision,
                   torch.float32, torch.float32, config=dict(TMA=tma))
        runs.append([ht, hs.data, U.data, o, dh.data, dY.data, dh0, *dx[:5]])
    for x, y in zip(*runs):
        assert torch.equal(x, y)


def test_serial_passes_keep_state_blocks_within_scale_blocks():
    """A pass's state blocks each lie within one column block of its operands' row scales
    (``PreparedKeys.state_rows``): operands scaled by blocks of 64 under a pass that asks for state blocks of 128 (the
    backward's recomputation, and the reverse pass given ``KB=128``) take blocks of 64, and agree with the operands
    scaled by blocks of 128 to the operands' fp16 rounding."""
    from refcheck.optimized.chunk.prepared import prepare_keys
    from refcheck.optimized.common import make_chunks
    from refcheck.optimized.kda.chunk_bwd import dstate
    from refcheck.optimized.kda.chunk_fwd import intra, recurrence
    from refcheck.optimized.kda.gate import gate_cumsum
    gen = torch.Generator().manual_seed(13)
    T, H, K, V = 100, 1, 128, 32
    q, k = (F.normalize(torch.randn(T, H, K, generator=gen), dim=-1) for _ in range(2))
    v, do = (torch.randn(T, H, V, generator=gen) for _ in range(2))
    beta = torch.rand(T, H, generator=gen)
    chunks = make_chunks(1, T, None, 64, "cpu")
    G = gate_cumsum(-torch.rand(T, H, K, generator=gen), None, None, None, chunks)
    Tm, P = intra(q, k, G, beta, chunks, K ** -0.5, front_flags(q, k, G, chunks), "tf32")
    runs = []
    for block in (64, 128):
        keys = prepare_keys(k, G, chunks, "tf32", q=q, config=dict(SB=block))
        assert keys.block == block and keys.state_rows(128) == block
        _, hs, U, _ = recurrence(keys, v, G, beta, Tm, None, chunks, "tf32", final=False, scaled=True)
        dh, dY, _ = dstate(keys, G, beta, Tm, P, do, None, chunks, K ** -0.5, "tf32", False, scaled=True,
                           config=dict(KB=128))
        runs.append([hs.float(), U.float(), dh.float(), dY.float()])
    for x, y in zip(*runs):
        torch.testing.assert_close(x, y, rtol=2e-3, atol=2e-3 * float(y.abs().max()))


def test_serial_passes_over_segments_take_each_launchs_value_block_through_tma():
    """Over segments (``chunk.segments``) the transitions' launch has W = V + K state columns and may take other value
    blocks than the steps' launch (here 64 against 32: 66 segments of one chunk, K = V = 64, as at B=1, T=32768 over
    segments of 128 chunks on an H100, where the v descriptor was built for the steps' blocks and the transitions'
    kernel did not compile): each launch reads v in its own blocks, bitwise as through pointers."""
    from refcheck.optimized.chunk.prepared import prepare_keys
    from refcheck.optimized.chunk.scaled import Stored
    from refcheck.optimized.chunk.segments import split
    from refcheck.optimized.chunk.state import serial_config
    from refcheck.optimized.common import make_chunks
    from refcheck.optimized.kda.chunk_fwd import recurrence
    from refcheck.optimized.kda.gate import gate_cumsum
    gen = torch.Generator().manual_seed(11)
    T, H, K, V = 66 * 64, 1, 64, 64
    k = F.normalize(torch.randn(T, H, K, generator=gen), dim=-1)
    v, beta = torch.randn(T, H, V, generator=gen).to(torch.bfloat16), torch.rand(T, H, generator=gen)
    chunks = make_chunks(1, T, None, 64, "cpu")
    segments = split(chunks, 1)
    assert [serial_config(segments.chunks, H, K, W, None)["BV"] for W in (V, V + K)] == [32, 64]
    G = gate_cumsum(-0.05 * torch.rand(T, H, K, generator=gen), None, None, None, chunks)
    # T = I in every chunk (U = Diag(beta) Z, the delta rule's values undecoupled): the launches read T alike whatever
    # it holds, and ``intra`` on 4224 tokens took most of this test's time interpreted
    Tm = Stored(F.one_hot(torch.arange(T) % 64, 64).float()[:, None, :].expand(T, H, 64).contiguous())
    keys = prepare_keys(k, G, chunks, "tf32")
    runs = []
    for tma in (True, False):
        ht, hs, U, _ = recurrence(keys, v, G, beta, Tm, None, chunks, "tf32", final=True, segments=segments,
                                  config=dict(TMA=tma))
        runs.append([ht, hs.data, U.data])
    for x, y in zip(*runs):
        assert torch.equal(x, y)


def test_segment_length_splits_only_a_gpu_left_idle():
    from refcheck.optimized.chunk.segments import segment_length
    from refcheck.optimized.common import make_chunks

    def length(B, T, H=16, V=128, lengths=None):
        cu = None if lengths is None else torch.tensor([0] + lengths).cumsum(0)
        return segment_length(make_chunks(B, T, cu, 64, "cpu"), H, V)
    assert length(1, 32768) == 64        # 32 programs for 132 SMs: 8 segments of 64 chunks
    assert length(1, 4096) == 16         # at least MIN_SEGMENT chunks
    assert length(2, 16384) == 64
    assert length(8, 4096) == 0          # 256 programs: two an SM already
    assert length(1, 32768, H=64) == 0   # 128 programs: the split's transitions would not pay
    assert length(1, 1000, H=2, V=64) == 0  # 16 chunks: too short to split
    assert length(1, 32768, lengths=[4096, 1000, 7000, 3000, 5000, 512, 8192, 3968]) == 0
    assert length(1, 0, lengths=[0]) == 0


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("K, V", [(16, 24), (80, 16)])
def test_segment_scan_chains_the_maps_in_float64(reverse, K, V):
    """``segments.scan`` (one launch) against the chain ``S_{j+1} = M_j S_j + E_j`` in float64, over sequences of
    3, 0, 1 and 2 segments; M transposed and E a view of wider rows (the strides the passes give it), K past one
    block of the map (80 > 64)."""
    from refcheck.optimized.chunk.segments import scan, split
    from refcheck.optimized.common import make_chunks
    gen = torch.Generator().manual_seed(5)
    chunks = make_chunks(1, 384, torch.tensor([0, 192, 192, 256, 384]), 64, "cpu")
    segments = split(chunks, 1)
    NS, H, N = 6, 2, 4
    E = torch.randn(NS, H, K, V + 7, generator=gen)[..., :V]
    M = (torch.randn(NS, H, K, K, generator=gen) / K ** 0.5).transpose(-1, -2)
    for first in (None, torch.randn(N, H, K, V, generator=gen)):
        entries, last = scan(E, M, first, segments, reverse)
        S = torch.zeros(N, H, K, V, dtype=torch.float64) if first is None else first.double()
        want_entries = torch.zeros(NS, H, K, V, dtype=torch.float64)
        for n, segs in enumerate([[0, 1, 2], [], [3], [4, 5]]):
            for s in reversed(segs) if reverse else segs:
                want_entries[s] = S[n]
                S[n] = M[s].double() @ S[n] + E[s].double()
        assert rel(entries, want_entries) < 1e-6 and rel(last, S) < 1e-6
        assert rel(last[1], want_entries.new_zeros(H, K, V) if first is None else first[1].double()) == 0


def test_host_work_over_segments_does_not_grow_with_their_number():
    """A forward and backward over 4 and over 16 segments of one chunk queue the same torch calls: each serial pass's
    scan is one launch, not a loop over segments (which at B=1, T=32768 on an H100 kept the host busier than the
    GPU: ``docs/kernels/kda.md``). Counted below the dispatcher, so the count holds on a GPU too."""
    import collections

    from torch.utils._python_dispatch import TorchDispatchMode

    class Calls(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.count = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.count[str(func.overloadpacket)] += 1
            return func(*args, **(kwargs or {}))

    counts = []
    for T in (256, 1024):
        x, opts = kda_case(T=T, h0=True, K=16, V=16, decay=-0.05)
        leaves = {n: t.requires_grad_() for n, t in x.items()}
        with Calls() as calls:
            o, ht = optimized.kda(**leaves, **opts, segment_chunks=1)
            torch.autograd.grad((o, ht), list(leaves.values()), (torch.ones_like(o), torch.ones_like(ht)))
        counts.append(calls.count)
    assert counts[0] == counts[1], counts[1] - counts[0]


def test_segment_plans_are_reused_for_one_chunk_table():
    from refcheck.optimized.chunk.segments import plan
    from refcheck.optimized.common import make_chunks
    chunks = make_chunks(1, 640, None, 64, "cpu")
    segments = plan(chunks, 1, 16, 2)
    assert segments is not None and plan(chunks, 1, 16, 2) is segments
    assert plan(chunks, 1, 16, 3) is not segments and plan(chunks, 1, 16, 0) is None
    assert plan(make_chunks(1, 640, torch.tensor([0, 640]), 64, "cpu"), 1, 16, 2) is not segments


def test_packed_chunk_tables_are_reused_until_cu_seqlens_changes():
    from refcheck.optimized.common import make_chunks
    cu = torch.tensor([0, 3, 70])
    table = make_chunks(1, 70, cu, 64, "cpu")
    assert make_chunks(1, 70, cu, 64, "cpu") is table
    assert make_chunks(1, 70, cu.clone(), 64, "cpu") is not table  # another tensor: validated and built again
    assert make_chunks(1, 70, cu, 32, "cpu") is not table
    cu[1] = 80  # changed in place: validated again
    with pytest.raises(ValueError, match="cu_seqlens"):
        make_chunks(1, 70, cu, 64, "cpu")
    rows = make_chunks(2, 70, None, 64, "cpu")
    assert make_chunks(2, 70, None, 64, "cpu") is rows and make_chunks(2, 71, None, 64, "cpu") is not rows


STRONG_EVERYWHERE = (slice(None), slice(None))  # every head and channel


@pytest.mark.parametrize("lengths, strong, safe, precision, K, unit_rows", [
    ([150], False, False, "ieee", 40, False),
    ([40, 0, 27, 83], STRONG_EVERYWHERE, False, "ieee", 40, False),  # strong decay where sequences end inside chunks
    ([150], STRONG_EVERYWHERE, False, "tf32", 40, False),
    ([150], (slice(None), slice(32, None)), False, "ieee", 40, False),  # past the channels diag_kernel's first tile holds
    ([150], (slice(None), slice(140, None)), False, "ieee", 160, False),  # in the second of the front's column blocks
    ([150], (1, slice(None)), False, "ieee", 40, True),  # one head of an exact_kernel program flagged, the others kept
    ([77, 73], False, True, "tf32x3", 40, True),
    # the blocks below the diagonal by fp16 dots, P fp16 (``chunk_fwd.half_pairs``), with and without flags
    ([150], False, False, "tf32", 40, True),
    ([40, 0, 27, 83], STRONG_EVERYWHERE, False, "tf32", 160, True),
])
def test_intra_factors_match_float64(lengths, strong, safe, precision, K, unit_rows):
    """``chunk_fwd.intra``'s T and P, row by row, against float64: per chunk ``A_ij = sum_d k_id k_jd e^{G_id - G_jd}``
    (j < i), ``P_ij = scale sum_d q_id k_jd e^{G_id - G_jd}`` (j <= i), ``T = (I + Diag(beta) A)^{-1}``, zeros above
    the diagonal; the flags mark exactly the sub-chunks whose decay exceeds ``DIAG_SPAN`` (the strong decay's here, none at
    the weak one; found by the front, ``front_flags``). ``strong``: the heads and channels whose decay is strong in rows
    20-59. Three heads: an exact rows' program takes four at K = 40 (``chunk_fwd.exact_launch``), so one lane of heads
    is masked off; at K = 160 the front's programs take two column blocks of 128. ``unit_rows``: q's and k's rows of
    unit length (they are here) declared, so that under "tf32" the blocks below the diagonal are summed by fp16 dots
    and P is fp16 (``chunk_fwd.half_pairs``, ``p_dtype``)."""
    from refcheck.optimized.common import make_chunks
    from refcheck.optimized.kda.chunk_fwd import intra
    from refcheck.optimized.kda.gate import gate_cumsum
    gen = torch.Generator().manual_seed(7)
    T, H = sum(lengths), 3
    q, k = (F.normalize(torch.randn(T, H, K, generator=gen), dim=-1) for _ in range(2))
    beta = torch.rand(T, H, generator=gen)
    g = -0.2 * torch.rand(T, H, K, generator=gen)  # weak: the blocks far below the diagonal carry weight
    if strong is not False:
        g[(slice(20, 60), *strong)] *= 1000.0
    cu = torch.tensor([0] + lengths).cumsum(0)
    chunks = make_chunks(1, T, cu, 64, "cpu")
    G = gate_cumsum(g, None, None, None, chunks, dtype=torch.float64)
    scale = K ** -0.5
    flags = None if safe else front_flags(q, k, G, chunks)
    Tm, P = intra(q, k, G, beta, chunks, scale, flags, precision, unit_rows=unit_rows)
    assert Tm.scaled == (precision == "tf32")
    assert P.dtype == (torch.float16 if unit_rows and precision == "tf32" else torch.float32)
    if Tm.scaled:  # each row's largest entry in [1/2, 1] of its scale
        peak = Tm.data.float().abs().amax(-1)
        assert bool(((peak > 0.5) & (peak <= 1)).all())
    Tm = Tm.float()
    # fp16 pairs (unit_rows): P within 4.1e-4, T 2.5e-4 (truncating "tf32" dots: 8.2e-4, 4.0e-4); their operands rounded
    # to bf16 instead reach 2.1e-3
    tol = 1e-5 if precision != "tf32" else 1e-3 if unit_rows else 2e-3
    bits = torch.zeros(chunks.num_chunks, H, dtype=torch.int32)  # bit b: sub-chunk b's decay exceeds DIAG_SPAN
    for c in range(chunks.num_chunks):
        t0 = int(chunks.start[c])
        n = min(int(cu[int(chunks.seq[c]) + 1]) - t0, 64)
        for h in range(H):
            rows = slice(t0, t0 + n)
            Gc = G[rows, h].double()
            low = torch.ones(n, n, dtype=torch.bool).tril()[..., None]
            E = torch.exp((Gc[:, None, :] - Gc[None, :, :]).where(low, -torch.inf))  # [i, j, d], zero for j > i
            A = torch.einsum("id,jd,ijd->ij", k[rows, h].double(), k[rows, h].double(), E).tril(-1)
            Pr = scale * torch.einsum("id,jd,ijd->ij", q[rows, h].double(), k[rows, h].double(), E)
            Tr = torch.linalg.inv(torch.eye(n, dtype=torch.float64) + beta[rows, h].double()[:, None] * A)
            for name, got, ref in (("T", Tm[rows, h, :n], Tr), ("P", P[rows, h, :n], Pr)):
                err = float((got.double() - ref).abs().max() / ref.abs().max())
                assert err <= tol, (name, c, h, err)
                assert bool((Tm[rows, h, n:] == 0).all() and (P[rows, h, n:] == 0).all()), (name, c, h)
            for b in range(0, n, 16):
                bits[c, h] |= int((Gc[b:b + 16] - Gc[min(b + 8, n - 1)]).abs().max() > 40) << (b // 16)
    if safe:
        assert flags is None
    else:
        assert torch.equal(flags, bits) and bool(bits.any()) == (strong is not False)


def test_fp16_pairs_and_p_only_where_their_operands_fit():
    """``chunk_fwd.half_pairs``: fp16 dots for the blocks below the diagonal only under "tf32" and with rows of unit
    length (every operand in [-1, 1]); ``p_dtype``: P in fp16 only there and where ``|P| <= |scale|`` fits fp16 and keeps
    its subnormals below a "tf32" rounding of its largest entries (``|scale|`` in [2^-8, 2^8])."""
    from refcheck.optimized.kda.chunk_fwd import half_pairs, p_dtype
    assert half_pairs(True, "tf32") and not half_pairs(False, "tf32")
    assert not (half_pairs(True, "tf32x3") or half_pairs(True, "ieee"))
    assert p_dtype(True, 128 ** -0.5) == p_dtype(True, -1.0) == p_dtype(True, 2.0 ** 8) == torch.float16
    assert p_dtype(True, 2.0 ** -9) == p_dtype(True, 300.0) == p_dtype(False, 0.1) == torch.float32


def test_kda_empty_sequences_keep_the_state():
    x, opts = kda_case(T=0, lengths=[0, 0], h0=True)
    o, ht = optimized.kda(**x, **opts)
    assert o.shape == (1, 0, 1, 32)
    torch.testing.assert_close(ht, x["initial_state"], rtol=0, atol=0)


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("lower_bound", [None, -3.0])
def test_kda_gate_matches_float64(dtype, lower_bound):
    gen = torch.Generator().manual_seed(2)
    g = (4 * torch.randn(2, 33, 3, 20, generator=gen)).to(DTYPES[dtype])
    A_log = torch.randn(3, generator=gen)
    dt_bias = torch.randn(60, generator=gen)
    dgate = torch.randn(2, 33, 3, 20, generator=gen, dtype=torch.float64)
    outs = []
    for fn, cast in ((optimized.kda_gate, lambda t: t), (references.kda_gate, lambda t: t.double())):
        leaves = [cast(t).detach().requires_grad_() for t in (g, A_log, dt_bias)]
        gate = fn(*leaves, lower_bound)
        outs.append((gate, torch.autograd.grad(gate, leaves, dgate.to(gate.dtype))))
    (gate, grads), (rgate, rgrads) = outs
    assert gate.dtype == torch.float32 and grads[0].dtype == g.dtype
    assert rel(gate, rgate) < 1e-6
    for a, b in zip(grads, rgrads):
        assert rel(a, b) < (1e-6 if dtype == "fp32" else 5e-3)


@pytest.mark.parametrize("dtype, seed, lower_bound, dt_bias", [
    ("fp32", 88632, -1 / 64, False),  # an H200 law run's draw: 3.703e-7 there, 7.08e-7 interpreted, naive 2.36e-7
    ("fp16", 2225, -1.0, True),       # 9.85e-7 interpreted
])
def test_kda_gate_single_element_within_its_guard(dtype, seed, lower_bound, dt_bias):
    """A gate of one element is as ill-conditioned as ``sigmoid(a x)`` at a large negative ``a x``: our kernel's few
    ulps there stay within its guards (kda_gate.gate.fp32.triton: 3.7e-7 plus 3x the naive error; fp16: 3e-6), which
    the former fixed 3.7e-7 and 5.6e-7 did not hold."""
    from refcheck.engine.verify import verify
    from refcheck.model.case import Case
    case = Case.make("kda_gate", {"B": 1, "H": 1, "K": 1, "T": 1}, dtype, seed, options={"lower_bound": lower_bound},
                     draw={"dt_bias": dt_bias, "input_scale": 1.0})
    verdict = verify("triton", case)
    gate = next(m for m in verdict.measurements if m.output == "gate")
    assert gate.error > 3e-7 and verdict.passed, verdict.table()


def _bad(**change):
    x, opts = kda_case(T=8)
    kw = x | opts | change
    with pytest.raises(ValueError) as err:
        optimized.kda(**kw)
    return str(err.value)


@pytest.mark.parametrize("change, name", [
    (dict(q=torch.randn(1, 8, 1, 300), k=torch.randn(1, 8, 1, 300), g=-torch.rand(1, 8, 1, 300)), "q"),
    (dict(v=torch.randn(1, 8, 1, 257)), "v"),
    (dict(safe_gate=True, lower_bound=-6.0), "lower_bound"),
    (dict(safe_gate=True, lower_bound=0.0), "lower_bound"),
    (dict(safe_gate=True, lower_bound=None), "lower_bound"),
    (dict(initial_state=torch.zeros(1, 1, 32, 32, dtype=torch.float64)), "initial_state"),
    (dict(initial_state=torch.zeros(2, 1, 32, 32)), "initial_state"),
    (dict(q=torch.randn(2, 8, 1, 32), k=torch.randn(2, 8, 1, 32), v=torch.randn(2, 8, 1, 32),
          g=-torch.rand(2, 8, 1, 32), beta=torch.rand(2, 8, 1), cu_seqlens=torch.tensor([0, 8])), "cu_seqlens"),
    (dict(cu_seqlens=torch.tensor([0, 5, 3, 8])), "cu_seqlens"),
    (dict(q=torch.randn(8, 1, 32)), "q"),
    (dict(k=torch.randn(1, 8, 1, 16)), "k"),
    (dict(beta=torch.rand(1, 8, 3)), "beta"),
    (dict(q=torch.randn(1, 8, 1, 32).double()), "q"),
    (dict(v=torch.ones(1, 8, 1, 32, dtype=torch.int32)), "v"),
    (dict(precision="fp64"), "precision"),
    (dict(use_gather=1), "use_gather"),
    (dict(segment_chunks=-1), "segment_chunks"),
    (dict(segment_chunks=True), "segment_chunks"),
    (dict(segment_chunks=2.0), "segment_chunks"),
    (dict(use_gate_in_kernel=True), "A_log"),
    (dict(use_gate_in_kernel=True, A_log=torch.zeros(2)), "A_log"),
    (dict(scale=-1.0), "scale"),
])
def test_kda_bad_input_names_the_argument(change, name):
    assert name in _bad(**change)


def test_kda_rejects_unknown_keywords():
    x, opts = kda_case(T=8)
    with pytest.raises(TypeError):
        optimized.kda(**x, **opts, chunk_size=32)


@pytest.mark.parametrize("args, name", [
    ((torch.randn(1, 4, 2, 8), torch.zeros(3)), "A_log"),
    ((torch.randn(1, 4, 2, 8), torch.zeros(2), torch.zeros(15)), "dt_bias"),
    ((torch.randn(4, 2, 8), torch.zeros(2)), "g"),
    ((torch.randn(1, 4, 2, 8), torch.zeros(2), None, 1.0), "lower_bound"),
])
def test_kda_gate_bad_input_names_the_argument(args, name):
    with pytest.raises(ValueError) as err:
        optimized.kda_gate(*args)
    assert name in str(err.value)
