"""Hypothesis strategies for refcheck: shapes, packed sequences, gates, options, dtypes and knobs.

Every strategy draws a small description (a ``Case``, a knob dict), never tensor entries: the
tensors are made from the case's seed by its op card (``refcheck.ops``), so Hypothesis shrinks
shapes, lengths and options, and a failure prints a case that rebuilds the same bits. Inputs are
constructed valid (lengths summed into cu_seqlens, H built as Hk * group, gates clamped by
construction), not filtered with ``assume``.

Entry points: ``cases(op, impl, limits, **require)`` draws a ``Case`` of ``op`` that ``impl`` can
run (its dtypes), ``knob_settings(impl)`` every knob it declares, ``modes(impl)`` its precision modes
and ``examples(law, impl, limits)`` all of that plus a law's own parameters. ``Limits`` bounds the
sizes: ``SMALL`` keeps CPU and interpreted runs fast, ``INTERPRETED`` for Triton kernels in the CPU interpreter, ``LARGE`` for the GPU.

Requirements (keyword arguments of ``cases``; each ignored where it does not apply to the op):
    min_len:   at least this many tokens (T; for packed cases the total)
    varlen:    True packed (B == 1 with cu_seqlens), False not packed, None either
    min_seqs:  packed cases get at least this many sequences
    min_batch: at least this many batch rows (implies varlen=False)
    dtype:     this input dtype only
    gate_dtype: gates of this dtype (linear ops; the raw gate with use_gate_in_kernel)
    causal:    attention with this causal flag
    min_keys:  attention: some sequence has at least this many keys
    rows_without_keys: attention: some query row sees no key (causal with S < T, or an empty key span)
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from hypothesis import strategies as st

from .case import Case
from .ops import card
from .registry import Implementation

CHUNK = 64
"""The chunk length of chunked kernels: lengths one short of, at and one past its multiples matter."""

SPECIAL_LENGTHS = (1, 2, 3, 5, 7, 13, 16, 17, 31, 63, 64, 65, 97, 127, 128, 129, 191, 192, 193, 257, 509, 1021, 1024, 1025)
"""T = 1, primes, and one short of / at / one past multiples of 16 (sub-chunk) and 64 (chunk)."""

SPECIAL_DIMS = (16, 32, 64, 8, 60, 100, 128, 192, 256, 4, 1)
"""Head dims: powers of two, the non powers of two seen in models (60, 100, 192), and tiny ones."""

MLA_DIMS = (192, 128)
"""Dqk, Dv of multi-head latent attention."""

GQA_GROUPS = (1, 2, 4, 3)
"""Query heads per key head."""


@dataclass(frozen=True)
class Limits:
    """Size bounds of drawn cases.

    max_len:      tokens per case (T; for packed cases the total); attention uses it for S too
    max_elements: bound on B * T * H * (K + V) (attention: B * max(T, S) * H * (Dqk + Dv)); long
                  sequences come with small heads and wide heads with short sequences
    mla:          attention also draws MLA's head dims 192/128 (beyond ``max_dim`` if need be)
    """

    max_batch: int = 3
    max_len: int = 130
    max_heads: int = 3
    max_dim: int = 256
    max_elements: int = 12_000
    max_seqs: int = 5
    mla: bool = True

    def __post_init__(self):
        for name in ("max_batch", "max_len", "max_heads", "max_dim", "max_elements", "max_seqs"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name}: expected a positive int, got {getattr(self, name)!r}")


SMALL = Limits()
"""Default: fast on the CPU and in the Triton interpreter (a kernel case costs seconds there)."""

INTERPRETED = Limits(max_batch=2, max_len=70, max_heads=2, max_dim=128, max_elements=4_000, max_seqs=3, mla=False)
"""For Triton kernels run by the CPU interpreter (seconds per call): at most two chunks of 64."""

LARGE = Limits(max_batch=4, max_len=1100, max_heads=8, max_dim=128, max_elements=2_000_000, max_seqs=12)
"""For GPU runs: several chunks per sequence, realistic head counts, head dims up to 128 (and MLA's
192/128): a bucket with K = 256 costs flash-linear-attention's chunk kernels minutes more of
compiling and autotuning; 256 is drawn on the CPU."""


# --- what a compiler specializes on ---------------------------------------------------------------

EMPTY: Mapping = MappingProxyType({})

FREE_DIMS = ("B", "T", "S")
"""Dims a kernel takes as runtime values (batch, lengths): free within a compile bucket."""

VALUE_PARAMS = ("normalizer", "mask_p", "spike_p", "spike", "clamp", "input_scale")
"""``Case.draw`` entries that shape tensor values only (gate distributions): free within a bucket."""

def signature(case: Case) -> tuple[tuple[str, object], ...]:
    """What a compiler may specialize on in ``case``: the dtype, the head counts and head dims,
    packed or not, every option (the scale too: flash-linear-attention's ``fused_recurrent_kda``
    takes it as a ``tl.constexpr``), and how inputs are drawn but not their values (gate dtype,
    initial state or not, cu_seqlens dtype, dt_bias or not). Autotuners key on these too: Triton's
    on the dtype of every tensor argument, so an absent initial state is a new key. Batch, lengths,
    packing boundaries, seeds and gate distributions are left out: a kernel takes them as runtime
    values. The items, sorted; ``linear_cases``, ``gate_cases`` and ``attention_cases`` take them
    back as ``pinned``."""
    fields = {"dtype": case.dtype, **{k: v for k, v in case.dims if k not in FREE_DIMS}}
    if case.op != "kda_gate":
        fields["packed"] = case.seqlens is not None
    fields.update(case.options)
    fields.update((k, v) for k, v in case.draw if k not in VALUE_PARAMS)
    return tuple(sorted(fields.items()))


def _picker(draw, pinned: Mapping):
    """``pick(name, strategy)``: the pinned value of ``name``, else one drawn from ``strategy``."""
    def pick(name: str, strategy: st.SearchStrategy):
        return pinned[name] if name in pinned else draw(strategy)
    return pick


# --- sizes ---------------------------------------------------------------------------------------

def lengths(low: int, high: int) -> st.SearchStrategy[int]:
    """A sequence length in ``[low, high]``: mostly the special lengths (1, primes, chunk and
    sub-chunk multiples +-1) that fit, else any; shrinks towards ``low``."""
    high = max(high, low)
    special = [n for n in SPECIAL_LENGTHS if low <= n <= high]
    uniform = st.integers(low, high)
    return st.one_of(uniform, st.sampled_from(special)) if special else uniform


def head_dims(max_dim: int, multiple: int = 1) -> st.SearchStrategy[int]:
    """A head dimension up to ``max_dim``: the special dims (16, 60, 100, 192, 256, ...) or any;
    only multiples of ``multiple`` (an implementation's ``dim_multiple``)."""
    special = [d for d in SPECIAL_DIMS if d <= max_dim and d % multiple == 0]
    anything = st.integers(1, max_dim // multiple).map(lambda d: multiple * d)
    return st.one_of(st.sampled_from(special), anything) if special else anything


def dim_multiple(impl: Implementation | None, dtype: str) -> int:
    """What ``impl``'s head dims must be a multiple of in ``dtype`` (1: anything)."""
    return 1 if impl is None else impl.dim_multiple.get(dtype, 1)


def _fit(limits: Limits, rows: int, heads: int, width: int, low: int) -> int:
    """The longest T with ``rows * T * heads * width <= max_elements`` (at least ``low``)."""
    return max(low, min(limits.max_len, limits.max_elements // max(1, rows * heads * width)))


@st.composite
def seqlens(draw, total_max: int, max_seqs: int, *, min_seqs: int = 1, min_total: int = 1,
            min_nonempty: int = 1) -> tuple[int, ...]:
    """Lengths of packed sequences (the differences of cu_seqlens): ``min_seqs..max_seqs`` of them,
    empty and length-1 sequences included, lengths that straddle chunk boundaries (63, 64, 65 and
    running offsets that cross multiples of 64), total in ``[min_total, total_max]``, at least
    ``min_nonempty`` sequences not empty."""
    n = draw(st.integers(max(min_seqs, min_nonempty), max(min_seqs, min_nonempty, max_seqs)))
    lens, left = [], total_max
    for _ in range(n):
        piece = draw(st.one_of(st.integers(0, left), st.sampled_from([0, 1, 63, 64, 65, 17, 15])))
        piece = min(piece, left)
        lens.append(piece)
        left -= piece
    # construct, don't filter: top up empty sequences (last ones first), then the last sequence
    for i in reversed(range(n)):
        if sum(1 for x in lens if x) >= min_nonempty or left == 0:
            break
        if lens[i] == 0:
            lens[i], left = 1, left - 1
    lens[-1] += min(left, max(0, min_total - sum(lens)))
    return tuple(lens)


def dtypes(op: str, impl: Implementation | None = None, only: str | None = None) -> st.SearchStrategy[str]:
    """An input dtype the op's card and the implementation both support (``only`` narrows it).
    fp8 is drawn only for an implementation that declares it (attention forward)."""
    allowed = [d for d in card(op).dtypes if impl is None or d in impl.dtypes]
    if impl is None:
        allowed = [d for d in allowed if d != "fp8"]
    if only is not None:
        allowed = [d for d in allowed if d == only]
    if not allowed:
        who = f"{impl.op}/{impl.name}" if impl else op
        raise ValueError(f"dtype: {who} supports none of the requested dtypes ({only or 'any'})")
    return st.sampled_from(allowed)


def seeds() -> st.SearchStrategy[int]:
    """The seed of a case's tensors (shrinks to 0)."""
    return st.integers(0, 2**31 - 1)


def scales() -> st.SearchStrategy[float | None]:
    """The readout/softmax scale: default (``None``, i.e. head_dim ** -0.5) or an explicit one."""
    return st.one_of(st.none(), st.sampled_from([1.0, 0.25, 0.1, 2.0]))


# --- gates ---------------------------------------------------------------------------------------

def lower_bounds() -> st.SearchStrategy[float]:
    """``lower_bound`` in [-5, 0): multiples of 1/16 and powers of two near 0, all exactly
    representable in bf16/fp16/fp32, so a gate clamped to it stays at or above it in every dtype."""
    return st.one_of(st.integers(1, 80).map(lambda k: -k / 16), st.sampled_from([-2.0**-6, -2.0**-10]))


@st.composite
def log_decays(draw, *, clamp: float | None = None, gate_dtype: str | None = None) -> dict:
    """The ``draw`` parameters of ``ops.draw_log_decay``: ``logsigmoid(N(0,1)) / normalizer`` with
    the normalizer in [0.1, 10], zeroed with probability ``mask_p``, a fraction ``spike_p`` pushed
    down to ``-U(0, spike)`` (spike up to 1000), clamped to ``[clamp, 0]`` for safe_gate, and the
    gate tensor's dtype."""
    params = {"normalizer": draw(st.one_of(st.sampled_from([1.0, 0.1, 10.0]),
                                           st.floats(0.1, 10.0).map(lambda x: float(f"{x:.3g}")))),
              "mask_p": draw(st.sampled_from([0.0, 0.2, 1.0])),
              "spike_p": draw(st.sampled_from([0.0, 0.05, 0.5]))}
    if params["spike_p"]:
        params["spike"] = draw(st.sampled_from([1000.0, 20.0, 5.0]))
    if clamp is not None:
        params["clamp"] = clamp
    params["gate_dtype"] = gate_dtype or draw(st.sampled_from(["fp32", "bf16", "fp16"]))
    return params


# --- knobs ---------------------------------------------------------------------------------------

def knob_settings(impl: Implementation) -> st.SearchStrategy[dict]:
    """A value for every knob ``impl`` declares except ``precision`` (drawn by ``modes``): the
    gather and non-gather paths, recompute or not, chunk sizes, ... are all exercised."""
    return st.fixed_dictionaries({name: st.sampled_from(list(values))
                                  for name, values in impl.knobs.items() if name != "precision"})


def modes(impl: Implementation, only: str | None = None) -> st.SearchStrategy[str]:
    """A precision mode ``impl`` offers (``only`` fixes it, e.g. from ``--precision``)."""
    if only is not None:
        if only not in impl.modes:
            raise ValueError(f"precision: {impl.op}/{impl.name} offers {impl.modes}, not {only!r}")
        return st.just(only)
    return st.sampled_from(list(impl.modes))


# --- cases ---------------------------------------------------------------------------------------

@st.composite
def linear_cases(draw, op: str, impl: Implementation | None = None, limits: Limits = SMALL, *,
                 min_len: int = 1, varlen: bool | None = None, min_seqs: int = 1, min_batch: int = 1,
                 dtype: str | None = None, gate_dtype: str | None = None, pinned: Mapping = EMPTY) -> Case:
    """A case of kda, gla or simple_gla: B, T (or packed lengths), H, K, V; initial state or not;
    the op's options; gates from ``log_decays`` (or raw gates with A_log / dt_bias for kda's
    ``use_gate_in_kernel``). ``pinned`` fixes what a compiler specializes on (``signature``)."""
    pick = _picker(draw, pinned)
    dt = pick("dtype", dtypes(op, impl, dtype))
    h = pick("H", st.integers(1, limits.max_heads))
    head_dim = head_dims(limits.max_dim, dim_multiple(impl, dt))
    k, v = pick("K", head_dim), pick("V", head_dim)
    if min_batch > 1:
        varlen = False
    packed = pick("packed", st.booleans() if varlen is None else st.just(varlen))
    seqs = None
    if packed:
        b = 1
        seqs = draw(seqlens(_fit(limits, 1, h, k + v, min_len), limits.max_seqs, min_seqs=min_seqs,
                            min_total=min_len, min_nonempty=min(min_seqs, 2)))
        t = sum(seqs)
    else:
        b = draw(st.integers(min_batch, max(min_batch, limits.max_batch)))
        t = draw(lengths(min_len, _fit(limits, b, h, k + v, min_len)))
    options = {"scale": pick("scale", scales()), "output_final_state": pick("output_final_state", st.booleans())}
    drawn = {"initial_state": pick("initial_state", st.booleans())}
    if seqs is not None:
        drawn["cu_dtype"] = pick("cu_dtype", st.sampled_from(["int32", "int64"]))
    clamp = None
    if op == "kda":
        # with K = 1, q / ||q|| is +-1 and its gradient only the 1e-6 epsilon's artifact (~1e-6 / |q|^3):
        # no relative error of it means anything, so l2norm is drawn from K = 2 on
        options["use_qk_l2norm"] = pick("use_qk_l2norm", st.booleans() if k > 1 else st.just(False))
        options["use_gate_in_kernel"] = gate_in_kernel = pick("use_gate_in_kernel", st.booleans())
        options["safe_gate"] = safe = pick("safe_gate", st.booleans())
        bounded = safe or (gate_in_kernel and draw(st.booleans()))
        options["lower_bound"] = pick("lower_bound", lower_bounds() if bounded else st.none())
        if gate_in_kernel:
            drawn["dt_bias"] = pick("dt_bias", st.booleans())
            drawn["gate_dtype"] = gate_dtype or pick("gate_dtype", st.sampled_from(["fp32", "bf16", "fp16"]))
        elif safe:
            clamp = options["lower_bound"]
    if "gate_dtype" not in drawn:
        drawn.update(draw(log_decays(clamp=clamp, gate_dtype=gate_dtype or pinned.get("gate_dtype"))))
    dims = {"B": b, "T": t, "H": h, "K": k, "V": v}
    return Case.make(op, dims, dt, draw(seeds()), seqlens=seqs, options=options, draw=drawn)


@st.composite
def gate_cases(draw, impl: Implementation | None = None, limits: Limits = SMALL, *, min_len: int = 1,
               min_batch: int = 1, dtype: str | None = None, pinned: Mapping = EMPTY, **_) -> Case:
    """A case of kda_gate: g ``[B, T, H, K]`` at scale 1, 10 or 30 (softplus beyond 20, saturated
    sigmoids), A_log, dt_bias or not, the softplus form or the lower-bound form."""
    pick = _picker(draw, pinned)
    dt = pick("dtype", dtypes("kda_gate", impl, dtype))
    h, k = pick("H", st.integers(1, limits.max_heads)), pick("K", head_dims(limits.max_dim))
    b = draw(st.integers(min_batch, max(min_batch, limits.max_batch)))
    t = draw(lengths(min_len, _fit(limits, b, h, k, min_len)))
    options = {"lower_bound": pick("lower_bound", st.one_of(st.none(), lower_bounds()))}
    drawn = {"input_scale": draw(st.sampled_from([1.0, 10.0, 30.0])), "dt_bias": pick("dt_bias", st.booleans())}
    return Case.make("kda_gate", {"B": b, "T": t, "H": h, "K": k}, dt, draw(seeds()), options=options, draw=drawn)


@st.composite
def attention_cases(draw, impl: Implementation | None = None, limits: Limits = SMALL, *, min_len: int = 1,
                    varlen: bool | None = None, min_seqs: int = 1, min_batch: int = 1, dtype: str | None = None,
                    causal: bool | None = None, min_keys: int = 1, rows_without_keys: bool = False,
                    pinned: Mapping = EMPTY, **_) -> Case:
    """A case of attention: GQA (H = Hk * group), Dqk != Dv (MLA's 192/128 included), T != S,
    causal or not, batched or packed with separate query and key lengths (empty spans included)."""
    pick = _picker(draw, pinned)
    dt = pick("dtype", dtypes("attention", impl, dtype))
    hk = pick("Hk", st.integers(1, limits.max_heads))
    h = pick("H", st.sampled_from(GQA_GROUPS).map(lambda group: hk * group))
    pairs = st.tuples(head_dims(limits.max_dim, dim_multiple(impl, dt)), head_dims(limits.max_dim, dim_multiple(impl, dt)))
    if limits.mla:
        pairs = st.one_of(pairs, st.just(MLA_DIMS))
    dqk, dv = (pinned["Dqk"], pinned["Dv"]) if "Dqk" in pinned else draw(pairs)
    if rows_without_keys:
        causal, min_len = True, max(min_len, 2)
    is_causal = pick("causal", st.booleans() if causal is None else st.just(causal))
    if min_batch > 1:
        varlen = False
    packed = pick("packed", st.booleans() if varlen is None else st.just(varlen))
    seqs = seqs_k = None
    if packed:
        b = 1
        cap = _fit(limits, 1, h, dqk + dv, max(min_len, min_keys))
        seqs = draw(seqlens(cap, limits.max_seqs, min_seqs=min_seqs, min_total=min_len, min_nonempty=min(min_seqs, 2)))
        n = len(seqs)
        seqs_k = draw(st.lists(st.integers(0, max(min_keys, cap // n)), min_size=n, max_size=n))
        if max(seqs_k) < min_keys:                          # construct: one span with enough keys
            seqs_k[draw(st.integers(0, n - 1))] = min_keys
        if rows_without_keys:                               # a query span longer than its key span
            i = max(range(n), key=lambda j: seqs[j])
            seqs_k[i] = draw(st.integers(0, seqs[i] - 1))
            if sum(seqs_k) == 0:                            # keep S >= 1 (seqs[i] >= 2 when n == 1)
                seqs_k[(i + 1) % n if n > 1 else i] = 1
        t, s, seqs_k = sum(seqs), sum(seqs_k), tuple(seqs_k)
    else:
        b = draw(st.integers(min_batch, max(min_batch, limits.max_batch)))
        cap = _fit(limits, b, h, dqk + dv, max(min_len, min_keys))
        t = draw(lengths(min_len, cap))
        if rows_without_keys:                               # causal is bottom-right: S < T
            s = draw(st.integers(max(1, min(min_keys, t - 1)), t - 1))
        elif draw(st.booleans()) and t >= min_keys:
            s = t
        else:
            s = draw(lengths(min_keys, cap))
    options = {"causal": is_causal, "scale": pick("scale", scales())}
    drawn = {"cu_dtype": pick("cu_dtype", st.sampled_from(["int32", "int64"]))} if packed else {}
    dims = {"B": b, "T": t, "S": s, "H": h, "Hk": hk, "Dqk": dqk, "Dv": dv}
    return Case.make("attention", dims, dt, draw(seeds()), seqlens=seqs, seqlens_k=seqs_k, options=options, draw=drawn)


def cases(op: str, impl: Implementation | None = None, limits: Limits = SMALL, *, pinned: Mapping = EMPTY,
          **require) -> st.SearchStrategy[Case]:
    """Cases of ``op`` that ``impl`` can run, within ``limits``, meeting ``require`` (see the module
    docstring; requirements that do not concern ``op`` are ignored), with the ``pinned`` fields of
    their ``signature`` (a compile bucket's) fixed."""
    if op in ("kda", "gla", "simple_gla"):
        keys = ("min_len", "varlen", "min_seqs", "min_batch", "dtype", "gate_dtype")
        return linear_cases(op, impl, limits, pinned=pinned, **{k: v for k, v in require.items() if k in keys})
    if op == "kda_gate":
        return gate_cases(impl, limits, pinned=pinned,
                          **{k: v for k, v in require.items() if k not in ("varlen", "gate_dtype")})
    if op == "attention":
        return attention_cases(impl, limits, pinned=pinned, **{k: v for k, v in require.items() if k != "gate_dtype"})
    card(op)
    raise ValueError(f"op: no case strategy for {op!r}")


# --- checking a fixed case against the same requirements -----------------------------------------

def _rows_without_keys(case) -> bool:
    """Attention: some query row sees no key (causal is bottom-right aligned: a span with more
    queries than keys; any span with queries but no keys)."""
    d = case.dim
    spans = list(zip(case.seqlens, case.seqlens_k)) if case.seqlens is not None else [(d["T"], d["S"])]
    causal = bool(case.opts.get("causal"))
    return any(q > 0 and (k == 0 or (causal and q > k)) for q, k in spans)


def meets(case, require: dict) -> bool:
    """Whether a fixed ``case`` meets a law's requirements (``Law.requires``: the keyword arguments
    of ``strategies.cases``, with the same meaning; a requirement that does not concern the op is met)."""
    d, op = case.dim, case.op
    attention, linear = op == "attention", op in ("kda", "gla", "simple_gla")
    packed = case.seqlens is not None
    checks = {
        "min_len": lambda n: d["T"] >= n,
        "varlen": lambda want: want is None or op == "kda_gate" or packed == want,
        "min_seqs": lambda n: not packed or len(case.seqlens) >= n,
        "min_batch": lambda n: not packed and d["B"] >= n,
        "dtype": lambda want: case.dtype == want,
        "gate_dtype": lambda want: not linear or case.drawn.get("gate_dtype", case.dtype) == want,
        "causal": lambda want: not attention or bool(case.opts.get("causal")) == want,
        "min_keys": lambda n: not attention or max(case.seqlens_k or (d["S"],), default=0) >= n,
        "rows_without_keys": lambda want: not attention or not want or _rows_without_keys(case),
    }
    unknown = set(require) - set(checks)
    if unknown:
        raise ValueError(f"requirements {sorted(unknown)} unknown to refcheck.strategies.meets")
    return all(checks[key](want) for key, want in require.items())


BOUNDARY_LENGTHS = (63, 64, 65, 129)
"""Sequence lengths at chunk boundaries (one short of, at, one past, one past two chunks of 64):
every law meets them as fixed examples in the ci profile, before the drawn ones."""


def boundary_cases(op: str, impl: Implementation | None, require: dict, lengths=BOUNDARY_LENGTHS) -> list[Case]:
    """Fixed cases of ``op`` at each length in ``lengths`` that meet ``require`` (``meets``) and
    that ``impl`` takes: small heads, no initial state (a state that leaks between packed
    sequences or batch rows shows), the final state returned, default gates and options; packed
    as two sequences (1 token, then T) where the law needs packing. Ops without a sequence axis of
    queries and keys alike (kda_gate) get none."""
    if op == "kda_gate":
        return []
    dtypes = [d for d in card(op).dtypes if impl is None or d in impl.dtypes]
    want = require.get("dtype")
    dtype = want if want in dtypes else ("fp32" if "fp32" in dtypes else dtypes[0] if dtypes else None)
    if dtype is None or (want is not None and want != dtype):
        return []
    found = []
    for t in lengths:
        packed = require.get("varlen") is True
        batch = max(1, int(require.get("min_batch", 1)))
        seqs = (1, t) if packed else None
        total = t + 1 if packed else t
        draw, options = {}, {}
        if op == "attention":
            dims = {"B": 1 if packed else batch, "T": total, "S": total, "H": 2, "Hk": 1, "Dqk": 16, "Dv": 16}
            options["causal"] = require.get("causal", True)
            case = Case.make(op, dims, dtype, t, seqlens=seqs, seqlens_k=seqs, options=options)
        else:
            dims = {"B": 1 if packed else batch, "T": total, "H": 1, "K": 16, "V": 16}
            options["output_final_state"] = True
            draw = {"initial_state": False, "gate_dtype": require.get("gate_dtype", dtype)}
            case = Case.make(op, dims, dtype, t, seqlens=seqs, options=options, draw=draw)
        if meets(case, require):
            found.append(case)
    return found


@dataclass(frozen=True)
class Example:
    """One drawn input of a law: a case, the precision mode, the implementation's knobs and the
    law's own parameters (a cut position, ...)."""

    case: Case
    mode: str
    knobs: dict = field(default_factory=dict)
    params: dict = field(default_factory=dict)

    def __repr__(self) -> str:
        extra = "".join(f", {k}={v!r}" for k, v in (*self.knobs.items(), *self.params.items()))
        return f"Example({self.case.to_python()}, mode={self.mode!r}{extra})"


@dataclass(frozen=True)
class Bucket:
    """One compile specialization of an implementation: a case ``signature`` (the fields pinned),
    a precision mode and knob values. Examples drawn in a bucket differ only in what the kernel
    takes at run time (batch, lengths, packing boundaries, values), so that once compiled, a bucket
    costs milliseconds per example (``refcheck.buckets``)."""

    pinned: tuple[tuple[str, object], ...]
    mode: str
    knobs: tuple[tuple[str, object], ...] = ()

    @staticmethod
    def wanted(require: Mapping) -> dict:
        """What requirements (``Law.requires``) ask of the fields a bucket pins."""
        causal = True if require.get("rows_without_keys") else require.get("causal")
        packed = False if require.get("min_batch", 1) > 1 else require.get("varlen")
        wanted = {"dtype": require.get("dtype"), "gate_dtype": require.get("gate_dtype"),
                  "causal": causal, "packed": packed}
        return {k: v for k, v in wanted.items() if v is not None}

    def admits(self, require: Mapping) -> bool:
        """Whether a case meeting ``require`` (``Law.requires``) can be drawn in this bucket: the
        requirements on what the bucket pins (dtype, gate dtype, packed, causal) agree with it."""
        pins = dict(self.pinned)
        return all(pins[k] == v for k, v in self.wanted(require).items() if k in pins)

    def describe(self) -> str:
        return " ".join(f"{k}={v}" for k, v in (*self.pinned, ("mode", self.mode), *self.knobs))


@st.composite
def examples(draw, law, impl: Implementation, limits: Limits = SMALL, mode: str | None = None,
             buckets: tuple[Bucket, ...] = ()) -> Example:
    """An input of ``law`` (a ``refcheck.laws.Law``) for ``impl``: a case meeting the law's
    requirements, a mode, every knob, and the law's parameters drawn for that case. With
    ``buckets``, what a compiler specializes on (the case's signature, the mode, the knobs) comes
    from one of those that admit the law's requirements; the rest is drawn freely."""
    if buckets:
        usable = [b for b in buckets if b.admits(law.requires)]
        if not usable:
            raise ValueError(f"law {law.name}: none of the {len(buckets)} compile buckets of "
                             f"{impl.op}/{impl.name} admits its requirements {dict(law.requires)}")
        bucket = draw(st.sampled_from(usable))
        case = draw(cases(impl.op, impl, limits, pinned=dict(bucket.pinned), **law.requires))
        chosen_mode, knobs = bucket.mode, dict(bucket.knobs)
    else:
        case = draw(cases(impl.op, impl, limits, **law.requires))
        chosen_mode, knobs = draw(modes(impl, mode)), draw(knob_settings(impl))
    params = draw(law.params(impl, case)) if law.params else {}
    return Example(case, chosen_mode, knobs, params)
