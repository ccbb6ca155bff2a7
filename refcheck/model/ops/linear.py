"""What the linear-attention records share (kda, gla, simple_gla, gated_delta_rule): the mechanism.

These ops run a recurrent state ``S [K, V]`` per sequence and head over tokens ``[B, T, H, ...]``,
packed sequences through ``cu_seqlens``, gated by log-decays ``g <= 0``. ``linear_card`` makes the
record of such an op from what is its own: its references, its gate's shape, whether it has a
``beta``, the options it draws (``options``), its extra grid cases and its implementations.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from hypothesis import strategies as st

from refcheck.references.kda import l2norm

from ...strategies import (
    EMPTY,
    SMALL,
    Limits,
    dtypes,
    fit,
    head_dims_of,
    lengths,
    log_decays,
    picker,
    scales,
    seeds,
    seqlens,
)
from ..case import DTYPES, Case
from .card import Extension, Grouping, Inputs, OpCard, Template, Templates, sweep_lengths
from .inputs import cu_seqlens, draw_log_decay, normal, rounded

LINEAR_DTYPES = ("fp32", "bf16", "fp16")

# --- tensors -------------------------------------------------------------------------------------

def linear_tensors(case: Case, device, *, gate_shape: Callable, with_beta: bool,
                   raw_gate: bool = False) -> tuple[dict, torch.Generator]:
    """q, k, v (and beta), the gate, cu_seqlens and the initial state of a linear op's case. Keys are
    unit-norm for the delta rule (stable for ``||k|| <= 1``) unless it normalizes them itself, else
    scaled by ``K ** -0.5`` (a realistic state scale); ``raw_gate``: the gate is drawn N(0, 1) for a
    gate function inside the kernel, else log-decays (``draw_log_decay``)."""
    d, drawn, opts = case.dim, case.drawn, case.opts
    gen = torch.Generator().manual_seed(case.seed)
    b, t, h, k, v = d["B"], d["T"], d["H"], d["K"], d["V"]
    hv = d.get("HV", h)     # value heads (grouped value heads: gated_delta_rule), the query/key heads' by default
    dt = case.torch_dtype
    q = normal(gen, (b, t, h, k), device)
    key = normal(gen, (b, t, h, k), device)
    if with_beta and not opts.get("use_qk_l2norm"):
        key = l2norm(key.double()).float()
    else:
        key = key * k ** -0.5
    tensors = {"q": rounded(q, dt), "k": rounded(key, dt), "v": rounded(normal(gen, (b, t, hv, v), device), dt)}
    gate_dtype = DTYPES[drawn.get("gate_dtype", case.dtype)]
    shape = gate_shape(b, t, hv, k)
    g = normal(gen, shape, device) if raw_gate else draw_log_decay(gen, shape, device, drawn)
    tensors["g"] = rounded(g, gate_dtype)
    if with_beta:
        tensors["beta"] = rounded(torch.sigmoid(normal(gen, (b, t, hv), device)), dt)
    n = b
    if case.seqlens is not None:
        tensors["cu_seqlens"] = cu_seqlens(case, case.seqlens, device)
        n = len(case.seqlens)
    if drawn.get("initial_state"):
        tensors["initial_state"] = normal(gen, (n, hv, k, v), device, 0.5)
    return tensors, gen


def gate_parameters(case: Case, gen: torch.Generator, device, width: int) -> dict:
    """``A_log [HV]`` and (unless the case draws none) ``dt_bias [HV * width]`` of a gate computed in the
    kernel (``HV``: the value heads, ``H`` unless grouped; ``width``: the gate's channels per head)."""
    h = case.dim.get("HV", case.dim["H"])
    out = {"A_log": (torch.rand(h, generator=gen) * 2.5).to(device)}
    if case.drawn.get("dt_bias", True):
        out["dt_bias"] = normal(gen, (h * width,), device, 0.5)
    return out


GATE_IN_KERNEL = Extension(
    "gate_in_kernel", ("use_gate_in_kernel", "A_log", "dt_bias"),
    "the gate computed in the kernel from a raw gate g: -exp(A_log) * softplus(g + dt_bias), as the models' layers call it")
GROUPED_VALUE_HEADS = Extension(
    "grouped_value_heads", (), "HV value heads over H query/key heads (HV a multiple of H; value head j reads "
    "query/key head j // (HV / H)); it has no keyword, so a kernel declines it in a record: in mykernels.py, "
    "MINE = refcheck.model.implementation.Implementation(OP, 'mine', 'mykernels:fn', "
    "declines=('grouped_value_heads',)), named as --impl mykernels:MINE",
    uses=lambda case: "HV" in case.dim)


STATE_POOL = Extension(
    "state_pool", ("ssm_state_indices", "inplace_final_state"),
    "decode over a pool of states (serving's continuous batching): initial_state a pool [P, H, K, V] (HV heads "
    "with grouped value heads), ssm_state_indices [N] each sequence's slot, inplace_final_state=True writes the "
    "final states back into those slots in place and returns none; no case draws it, law state_pool calls it")


def gate_in_kernel_draws(pick, gate_dtype: str | None) -> dict:
    """``Case.draw`` entries of a gate computed in the kernel: dt_bias or not, the raw gate's dtype."""
    return {"dt_bias": pick("dt_bias", st.booleans()),
            "gate_dtype": gate_dtype or pick("gate_dtype", st.sampled_from(["fp32", "bf16", "fp16"]))}


# --- cases ---------------------------------------------------------------------------------------

Options = Callable[..., tuple[dict, dict, float | None]]
"""An op's own options: ``(draw, pick, k, gate_dtype, declined) -> (options, drawn, clamp)``: keyword
options of the call (none of the ``declined`` extensions'), ``Case.draw`` entries (a ``gate_dtype``
there means the gate is raw, not log-decays) and the clamp of the log-decays (safe_gate's lower
bound), or None."""


def no_options(draw, pick, k, gate_dtype, declined) -> tuple[dict, dict, float | None]:
    return {}, {}, None


def linear_cases(name: str, of_dtypes: tuple[str, ...], options: Options, value_groups: tuple[int, ...] = (1,)) -> Callable:
    """The case strategy of a linear op: B, T (or packed lengths), H, K, V (and ``HV`` value heads, ``H``
    times one of ``value_groups``, where that is not 1, unless the kernel declines extension
    ``grouped_value_heads``); initial state or not; the scale, output_final_state and the op's own
    ``options`` (none of a ``declined`` extension's); gates from ``log_decays``.
    ``pinned`` fixes what a compiler specializes on (``refcheck.engine.examples.signature``)."""
    @st.composite
    def cases(draw, impl=None, limits: Limits = SMALL, *, min_len: int = 1, varlen: bool | None = None,
              min_seqs: int = 1, min_batch: int = 1, dtype: str | None = None, gate_dtype: str | None = None,
              causal: bool | None = None, grouped: bool | None = None, pinned: Mapping = EMPTY,
              declined: frozenset = frozenset()) -> Case:
        if causal is False:
            raise ValueError(f"causal: every {name} case is causal")
        pick = picker(draw, pinned)
        dt = pick("dtype", dtypes(of_dtypes, impl, dtype))
        h = pick("H", st.integers(1, limits.max_heads))
        # value heads: a group of them per query/key head; a pinned signature has HV where its case had GVA
        groups = (1,) if GROUPED_VALUE_HEADS.name in declined or grouped is False else value_groups
        if grouped:
            groups = tuple(n for n in groups if n > 1)
            if not groups:
                raise ValueError(f"grouped: {name} has no grouped value heads to draw")
        hv = pinned.get("HV", h) if pinned else h * (draw(st.sampled_from(groups)) if len(groups) > 1 else 1)
        k, v = (pick(n, head_dims_of(impl, dt, n, limits.max_dim)) for n in ("K", "V"))
        if min_batch > 1:
            varlen = False
        packed = pick("packed", st.booleans() if varlen is None else st.just(varlen))
        seqs = None
        if packed:
            b = 1
            seqs = draw(seqlens(fit(limits, 1, hv, k + v, min_len), limits.max_seqs, min_seqs=min_seqs,
                                min_total=min_len, min_nonempty=min(min_seqs, 2)))
            t = sum(seqs)
        else:
            b = draw(st.integers(min_batch, max(min_batch, limits.max_batch)))
            t = draw(lengths(min_len, fit(limits, b, hv, k + v, min_len)))
        opts = {"scale": pick("scale", scales()), "output_final_state": pick("output_final_state", st.booleans())}
        drawn = {"initial_state": pick("initial_state", st.booleans())}
        if seqs is not None:
            drawn["cu_dtype"] = pick("cu_dtype", st.sampled_from(["int32", "int64"]))
        own, own_drawn, clamp = options(draw, pick, k, gate_dtype, declined)
        opts.update(own)
        drawn.update(own_drawn)
        if "gate_dtype" not in drawn:
            drawn.update(draw(log_decays(clamp=clamp, gate_dtype=gate_dtype or pinned.get("gate_dtype"))))
        dims = {"B": b, "T": t, "H": h, "K": k, "V": v, **({"HV": hv} if hv != h else {})}
        return Case.make(name, dims, dt, draw(seeds()), seqlens=seqs, options=opts, draw=drawn)
    return cases


def linear_grid(varlen_options: Mapping = EMPTY, extra: tuple = ()) -> Callable[[bool], Templates]:
    """The grid of a linear op: a dense batch (one partial chunk) with initial and final states,
    packed sequences (an empty one, one across a chunk boundary; with ``varlen_options``), packed
    sequences without initial state to reset to (a state leaking between packed sequences shows) and
    without final state (``output_final_state=False``: the kernel returns None), a partial last chunk of
    one token (T = 65) with a given scale (0.3, not the default), steep decay over a partial last chunk,
    then ``extra`` base cases ``(label, T, options[, dims[, template keywords]])`` (``devices``: a case
    sized for a GPU); the sweep returns the final state too. Two heads
    where heads can be mixed up (the dense batch, the packed states, the partial chunk), one where the
    case is about the sequence (the leak, the steep decay): an interpreted kernel's time grows with its
    programs, one per head and chunk."""
    def templates(quick: bool) -> Templates:
        final = {"output_final_state": True}
        base: list[Template]
        if quick:
            base = [("dense", dict(B=1, T=24, H=1, K=8, V=8), dict(options=final, draw={"initial_state": True}))]
        else:
            dims = dict(H=2, K=16, V=24)
            base = [("dense", dict(dims, B=2, T=40), dict(options=final, draw={"initial_state": True})),
                    ("varlen", dict(dims, B=1, T=97),
                     dict(seqlens=(17, 0, 80), draw={"initial_state": True}, options=dict(final, **varlen_options))),
                    ("varlen_no_h0", dict(dims, B=1, T=100, H=1), dict(seqlens=(35, 0, 65))),
                    ("chunk_plus_one", dict(dims, B=1, T=65), dict(options=dict(final, scale=0.3))),
                    ("steep_partial", dict(dims, B=1, T=70, H=1),
                     dict(options=final, draw={"initial_state": True, "normalizer": 0.1}))]
            base += [(label, dict(dims, B=1, T=t, **(more[0] if more else {})),
                      dict(options=dict(final, **opts), **(more[1] if len(more) > 1 else {})))
                     for label, t, opts, *more in extra]
        sweep_dims = dict(B=1, H=1, K=8, V=8) if quick else dict(B=1, H=1, K=16, V=16)
        return base, [(f"T={t}", dict(sweep_dims, T=t), dict(options=final)) for t in sweep_lengths(quick)]
    return templates


def linear_boundary(t: int, dtype: str, packed: bool, batch: int, require: Mapping) -> tuple[dict, dict]:
    """A small fixed case of ``t`` tokens (packed: a 1-token sequence, then ``t``): one head, K = V = 16,
    no initial state (a state that leaks between sequences or rows shows), the final state returned."""
    dims = {"B": 1 if packed else batch, "T": t + 1 if packed else t, "H": 1, "K": 16, "V": 16}
    return dims, dict(seqlens=(1, t) if packed else None, options={"output_final_state": True},
                      draw={"initial_state": False, "gate_dtype": require.get("gate_dtype", dtype)})


def empty_linear_outputs(case: Case, x: Inputs, length: int, n: int, provides) -> dict:
    """A packed sequence without tokens: no output rows, its initial state (or zeros) as final state."""
    d, ref = case.dim, x.tensors["q"]
    hv = d.get("HV", d["H"])
    out = {"o": ref.new_zeros(1, 0, hv, d["V"])}
    if case.opts.get("output_final_state"):
        h0 = x.tensors.get("initial_state")
        dims = (d["V"], d["K"]) if case.opts.get("state_v_first") else (d["K"], d["V"])   # gated_delta_rule's layout
        out["final_state"] = h0[n:n + 1] if h0 is not None else torch.zeros(1, hv, *dims, device=ref.device)
    return out


# The linear cards list flash-linear-attention's entry points as peers. Its Triton kernels run on the
# CPU through the faithful interpreter; there fla.utils finds no GPU ("roll back to CPU"): no TF32
# (chunk_kda's solve_tril dots run ieee, tf32 on Hopper) and no large shared memory (smaller BK/BV
# autotune lists): the kernels FLA would launch on such a GPU, judged by the same budgets.


def fla_gated_chunk_backward_refusal(device: str, case=None) -> str | None:
    """Why flash-linear-attention refuses the backward of its scalar-gated chunk entry points
    (``chunk_simple_gla``, ``chunk_gated_delta_rule``) on ``device`` (any case), or None: on Hopper
    with Triton >= 3.4.0 and < 3.7.1 their gated ``chunk_bwd_dqkwg`` raises RuntimeError ("produces
    incorrect results ... see #640"), its own flags deciding."""
    if torch.device(device).type != "cuda":
        return None
    from fla.utils import IS_NVIDIA_HOPPER, TRITON_ABOVE_3_4_0, TRITON_ABOVE_3_7_1
    if IS_NVIDIA_HOPPER and TRITON_ABOVE_3_4_0 and not TRITON_ABOVE_3_7_1:
        import triton
        return (f"flash-linear-attention refuses the gated chunk backward on Hopper with triton {triton.__version__} "
                "(>= 3.4.0, < 3.7.1: 'produces incorrect results', fla-org/flash-linear-attention#640)")
    return None


def linear_card(name: str, *, reference, chunked_reference, differentiable: tuple[str, ...], make_inputs,
                options: Options = no_options, grid_varlen_options: Mapping = EMPTY, grid_extra: tuple = (),
                shared_inputs: tuple[str, ...] = (), implementations: tuple = (),
                input_dtypes: tuple[str, ...] = LINEAR_DTYPES, value_groups: tuple[int, ...] = (1,),
                extensions: tuple[Extension, ...] = ()) -> OpCard:
    """The record of a linear-attention op: outputs ``o`` and ``final_state``; traits varlen, state,
    causal and decay_gate (and state_pool with extension ``STATE_POOL``); every token input along the
    query axis; ``value_groups``: the value heads per query/key head its cases draw (grouped value heads:
    then extension ``grouped_value_heads`` is one of its ``extensions``)."""
    grouping = None
    if len(value_groups) > 1:
        extensions = (*extensions, GROUPED_VALUE_HEADS)
        grouping = Grouping(("q", "k"), "H", "HV", GROUPED_VALUE_HEADS.name)
    token_inputs = {n: "q" for n in differentiable if n not in ("initial_state", *shared_inputs)}
    return OpCard(
        name, reference, chunked_reference, ("o", "final_state"), differentiable, input_dtypes, make_inputs,
        cases=linear_cases(name, input_dtypes, options, value_groups),
        traits=frozenset({"varlen", "state", "causal", "decay_gate", *(("grouped_heads",) if grouping else ()),
                          *(("state_pool",) if any(e.name == STATE_POOL.name for e in extensions) else ())}),
        grid=linear_grid(grid_varlen_options, grid_extra), boundary=linear_boundary,
        token_axes=token_inputs, join_dims={"o": 1, "final_state": 0}, shared_inputs=shared_inputs,
        causal=lambda case: True, empty_outputs=empty_linear_outputs, implementations=implementations,
        chunk_options={"decays": "differenced"}, extensions=extensions, grouping=grouping)
