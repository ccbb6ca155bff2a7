"""A law's examples: cases drawn from the op records, fixed boundary cases, compile buckets.

``examples(law, impl, limits)`` draws an ``Example`` (a case meeting the law's requirements, a
precision mode, every knob, the law's own parameters) for ``impl``; ``cases(op, impl, limits,
**require)`` draws a case through the op's card (``OpCard.cases``), ``meets(case, require)`` checks
a fixed case against the same requirements (``refcheck.model.ops.REQUIREMENTS``), ``boundary_cases`` gives
the fixed examples at chunk boundaries, and ``signature`` / ``Bucket`` what a compiler specializes
on (``refcheck.engine.buckets``).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from ..model.case import Case
from ..model.implementation import Implementation
from ..model.ops import card
from ..strategies import EMPTY, SMALL, Limits, knob_settings, modes

FREE_DIMS = ("B", "T", "S")
"""Dims a kernel takes as runtime values (batch, lengths): free within a compile bucket."""

VALUE_PARAMS = ("normalizer", "mask_p", "spike_p", "spike", "clamp", "input_scale")
"""``Case.draw`` entries that shape tensor values only (gate distributions): free within a bucket."""


def signature(case: Case) -> tuple[tuple[str, Any], ...]:
    """What a compiler may specialize on in ``case``: the dtype, the head counts and head dims,
    packed or not, every option (the scale too: flash-linear-attention's ``fused_recurrent_kda``
    takes it as a ``tl.constexpr``), and how inputs are drawn but not their values (gate dtype,
    initial state or not, cu_seqlens dtype, dt_bias or not). Autotuners key on these too: Triton's
    on the dtype of every tensor argument, so an absent initial state is a new key. Batch, lengths,
    packing boundaries, seeds and gate distributions are left out: a kernel takes them as runtime
    values. The items, sorted; every op card's ``cases`` takes them back as ``pinned``."""
    fields = {"dtype": case.dtype, **{k: v for k, v in case.dims if k not in FREE_DIMS}}
    if "varlen" in card(case.op).traits:
        fields["packed"] = case.seqlens is not None
    fields.update(case.options)
    fields.update((k, v) for k, v in case.draw if k not in VALUE_PARAMS)
    return tuple(sorted(fields.items()))


def cases(op: str, impl: Implementation | None = None, limits: Limits = SMALL, *, pinned: Mapping = EMPTY,
          **require) -> st.SearchStrategy[Case]:
    """Cases of ``op`` that ``impl`` can run, within ``limits``, meeting ``require`` (requirements
    that do not concern ``op`` are ignored), with the ``pinned`` fields of their ``signature`` (a
    compile bucket's) fixed, using none of the extensions ``impl`` declines (``OpCard.declined``)."""
    op_card = card(op)
    declined = op_card.declined(impl)
    if not declined:
        return op_card.cases(impl, limits, pinned=pinned, **op_card.relevant(require))
    # the op's strategy draws none of the declined extensions; the filter holds any strategy to it
    drawn = op_card.cases(impl, limits, pinned=pinned, declined=declined, **op_card.relevant(require))
    return drawn.filter(lambda case: not op_card.uses_declined(case, declined))


def meets(case: Case, require: Mapping) -> bool:
    """Whether a fixed ``case`` meets a law's requirements (``Law.requires``; a requirement that does
    not concern the op is met)."""
    return card(case.op).meets(case, require)


BOUNDARY_LENGTHS = (63, 64, 65, 129)
"""Sequence lengths at chunk boundaries (one short of, at, one past, one past two chunks of 64):
every law meets them as fixed examples in the ci profile, before the drawn ones."""


def boundary_cases(op: str, impl: Implementation | None, require: dict, lengths=BOUNDARY_LENGTHS) -> list[Case]:
    """Fixed cases of ``op`` at each length in ``lengths`` that meet ``require`` and that ``impl``
    takes: the card's ``boundary`` case (small heads, no initial state, default gates and options),
    packed as two sequences (1 token, then T) where the law needs packing. Ops without a boundary
    case (no sequence axis worth it) get none."""
    op_card = card(op)
    if op_card.boundary is None:
        return []
    dtypes = [d for d in op_card.dtypes if impl is None or d in impl.dtypes]
    want = require.get("dtype")
    dtype = want if want in dtypes else ("fp32" if "fp32" in dtypes else dtypes[0] if dtypes else None)
    if dtype is None or (want is not None and want != dtype):
        return []
    found = []
    for t in lengths:
        packed = require.get("varlen") is True
        batch = max(1, int(require.get("min_batch", 1)))
        dims, made = op_card.boundary(t, dtype, packed, batch, require)
        case = Case.make(op, dims, dtype, t, **made)
        if op_card.meets(case, require):
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
    costs milliseconds per example (``refcheck.engine.buckets``)."""

    pinned: tuple[tuple[str, Any], ...]
    mode: str
    knobs: tuple[tuple[str, Any], ...] = ()

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
    """An input of ``law`` (a ``refcheck.engine.laws.Law``) for ``impl``: a case meeting the law's
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
