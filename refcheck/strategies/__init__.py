"""Hypothesis strategies for refcheck: the building blocks of every op's cases.

Sizes (``lengths``, ``head_dims``, ``seqlens``), values of options (``scales``, ``lower_bounds``,
``log_decays``), dtypes, seeds, an implementation's knobs (``knob_settings``) and precision modes
(``modes``), and ``Limits`` on sizes: ``SMALL`` keeps CPU and interpreted runs fast, ``INTERPRETED``
for Triton kernels in the CPU interpreter, ``LARGE`` for the GPU. Nothing here names an op: each op's
record (``refcheck.model.ops``) composes these into its case strategy, and ``refcheck.engine.examples`` draws a
law's examples from the records.

Every strategy draws a small description (a ``Case``, a knob dict), never tensor entries: the
tensors are made from the case's seed by its op record, so Hypothesis shrinks shapes, lengths and
options, and a failure prints a case that rebuilds the same bits. Inputs are constructed valid
(lengths summed into cu_seqlens, H built as Hk * group, gates clamped by construction), not
filtered with ``assume``. ``picker(draw, pinned)`` takes a value from ``pinned`` where a compile
bucket fixes it (``refcheck.engine.examples.signature``), else draws it.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from hypothesis import strategies as st

from ..model.implementation import Implementation

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


EMPTY: Mapping = MappingProxyType({})


_DRAWN = object()


def picker(draw, pinned: Mapping = EMPTY):
    """``pick(name, strategy, absent=...)``: the pinned value of ``name``, else one drawn from ``strategy``;
    with ``absent``, for a field a case has only when it uses it (an optional keyword): a pinned signature
    without ``name`` gives ``absent`` (its case did not have it), not a draw."""
    def pick(name: str, strategy: st.SearchStrategy, absent=_DRAWN):
        if name in pinned:
            return pinned[name]
        if pinned and absent is not _DRAWN:
            return absent
        return draw(strategy)
    return pick


# --- sizes ---------------------------------------------------------------------------------------

def lengths(low: int, high: int) -> st.SearchStrategy[int]:
    """A sequence length in ``[low, high]``: mostly the special lengths (1, primes, chunk and
    sub-chunk multiples +-1) that fit, else any; shrinks towards ``low``."""
    high = max(high, low)
    special = [n for n in SPECIAL_LENGTHS if low <= n <= high]
    uniform = st.integers(low, high)
    return st.one_of(uniform, st.sampled_from(special)) if special else uniform


def head_dims(max_dim: int, multiple: int = 1, minimum: int = 1) -> st.SearchStrategy[int]:
    """A head dimension in ``[minimum, max_dim]``: the special dims (16, 60, 100, 192, 256, ...) or
    any; only multiples of ``multiple``."""
    special = [d for d in SPECIAL_DIMS if minimum <= d <= max_dim and d % multiple == 0]
    anything = st.integers(-(-minimum // multiple), max_dim // multiple).map(lambda d: multiple * d)
    return st.one_of(st.sampled_from(special), anything) if special else anything


def head_dims_of(impl: Implementation | None, dtype: str, name: str, max_dim: int) -> st.SearchStrategy[int]:
    """Head dim ``name`` (K, V, Dqk, Dv) for ``impl`` in ``dtype``: ``head_dims`` within what it
    declares, multiples of its ``dim_multiple`` for the dtype and at least its ``min_dims`` for the name,
    or one of its fixed ``head_dims``."""
    if impl is None:
        return head_dims(max_dim)
    if impl.head_dims is not None:
        fixed = [d for d in impl.head_dims if d <= max_dim] or [min(impl.head_dims)]
        return st.sampled_from(fixed)
    return head_dims(max_dim, impl.dim_multiple.get(dtype, 1), impl.min_dims.get(name, 1))


def fit(limits: Limits, rows: int, heads: int, width: int, low: int) -> int:
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


def dtypes(of_op: tuple[str, ...], impl: Implementation | None = None, only: str | None = None) -> st.SearchStrategy[str]:
    """An input dtype of the op (``of_op``: its card's) that the implementation supports too
    (``only`` narrows it)."""
    allowed = [d for d in of_op if impl is None or d in impl.dtypes]
    if only is not None:
        allowed = [d for d in allowed if d == only]
    if not allowed:
        who = f"{impl.op}/{impl.name}" if impl else "the op"
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


