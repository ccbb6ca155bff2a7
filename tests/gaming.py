"""Kernels that game a check instead of computing the op: the semantic patterns of the published catalogues
(KernelArena's, Makora's KernelHacks), each small, for attention and for gated_delta_rule. ``HACKS`` maps each
to the law that catches it (``tests/test_gaming.py``); every one computes the op correctly some of the time,
as a hack that passes a loose check does.

A hack is written against the naive form (the reference evaluated in the input dtype), so what it gets
wrong is its trick alone.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from refcheck.model import naive
from refcheck.model.registry import Implementation


@dataclass(frozen=True)
class Hack:
    impl: Implementation
    caught_by: str
    pattern: str
    says: str = ""      # what the verdict's message names (where more than a wrong value)


HACKS: dict[str, Hack] = {}
EXTENSIONS = {"attention": ("window", "softcap", "sinks"), "gated_delta_rule": ("gate_in_kernel", "grouped_value_heads")}


def hack(op: str, caught_by: str, pattern: str, says: str = "", backward: bool = True):
    """Decorator: ``fn`` games ``op`` with ``pattern``; law ``caught_by`` must catch it, saying ``says``
    (``backward=False``: a forward kernel, so that only the trick, not a missing gradient, can fail it)."""
    def register(fn):
        globals()[f"_{fn.__name__}_fn"] = fn
        impl = Implementation(op, f"{__name__}:{fn.__name__}", f"{__name__}:_{fn.__name__}_fn", backward=backward,
                              declines=EXTENSIONS[op], description=(fn.__doc__ or "").strip())
        HACKS[fn.__name__] = Hack(impl, caught_by, pattern, says)
        return impl
    return register


# --- an output that is an input, or aliases one ----------------------------------------------------

@hack("attention", "agreement", "a copy of an input where the check is loose")
def attention_copies_v(q, k, v, **options):
    """o is a copy of v's first T rows of each key head, repeated over the group (right where every query
    sees one key: T = S = 1)."""
    o, lse = naive.attention(q, k, v, **options)
    groups = q.shape[2] // k.shape[2]
    rows = v[:, :q.shape[1]].repeat_interleave(groups, 2)
    if rows.shape == o.shape:
        o = rows.clone()
    return o, lse


@hack("attention", "agreement", "an input returned as the output (the same storage)", "shares its storage with input v")
def attention_returns_v_itself(q, k, v, **options):
    """Where o has v's shape, v itself is returned (right where every query sees one key, T = S = 1)."""
    o, lse = naive.attention(q, k, v, **options)
    return (v if v.shape == o.shape and v.dtype == o.dtype else o), lse


@hack("gated_delta_rule", "agreement", "the initial state returned as the final state (the same storage)",
      "shares its storage with input initial_state")
def gdr_final_state_is_the_initial_state(q, k, v, g, beta, *, initial_state=None, **options):
    """With an initial state, the final state returned is that tensor itself, updated in place."""
    o, final = naive.gated_delta_rule(q, k, v, g, beta, initial_state=initial_state, **options)
    if initial_state is not None and final is not None and final.shape == initial_state.shape:
        with torch.no_grad():
            initial_state.copy_(final)
        return o, initial_state
    return o, final


# --- a tensor that is not what it seems -------------------------------------------------------------

class LazyTensor(torch.Tensor):
    """A tensor subclass that would compute the reference when read (here it already holds the values)."""


@hack("attention", "agreement", "a tensor subclass (lazy: computes when compared)",
      "where the contract returns a plain torch.Tensor")
def attention_lazy_subclass(q, k, v, **options):
    o, lse = naive.attention(q, k, v, **options)
    return o.as_subclass(LazyTensor), lse


# --- results cached by pointer or by shape (forward kernels: a cached result has no graph to the new inputs) ---

_BY_POINTER: dict = {}
_BY_SHAPE: dict = {}


@hack("attention", "inputs_rewritten", "a result cached by the inputs' addresses", backward=False)
def attention_cached_by_pointer(q, k, v, **options):
    key = (q.data_ptr(), k.data_ptr(), v.data_ptr(), q.shape)
    if key not in _BY_POINTER:
        _BY_POINTER[key] = naive.attention(q.detach(), k.detach(), v.detach(), **options)
    o, lse = _BY_POINTER[key]
    return o.clone(), lse.clone()


@hack("gated_delta_rule", "inputs_rewritten", "a result cached by the inputs' shapes", backward=False)
def gdr_cached_by_shape(q, k, v, g, beta, **options):
    key = (q.shape, v.shape, q.dtype, tuple(sorted((n, repr(x.shape) if torch.is_tensor(x) else repr(x))
                                                  for n, x in options.items())))
    if key not in _BY_SHAPE:
        _BY_SHAPE[key] = naive.gated_delta_rule(q.detach(), k.detach(), v.detach(), g.detach(), beta.detach(),
                                                **{n: x.detach() if torch.is_tensor(x) else x for n, x in options.items()})
    return tuple(None if x is None else x.clone() for x in _BY_SHAPE[key])


# --- lower precision ---------------------------------------------------------------------------------

@hack("attention", "agreement", "fp32 inputs computed in bf16")
def attention_in_bf16(q, k, v, **options):
    o, lse = naive.attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), **options)
    return o.to(q.dtype), lse.float()


# --- a buffer never written ---------------------------------------------------------------------------

@hack("attention", "no_side_effects", "an output buffer left unwritten (a stale buffer holding an earlier result)")
def attention_stale_rows(q, k, v, **options):
    """The last query row is never written: what the buffer held before is returned there."""
    o, lse = naive.attention(q, k, v, **options)
    out = torch.empty_like(o)
    out[:, :-1] = o[:, :-1]
    return out, lse


# --- not caught yet: a kernel that detects the judge ------------------------------------------------------------

def attention_detects_the_harness(q, k, v, **options):
    """Correct while refcheck's laws are imported in its process (the judge's), zeros elsewhere: verification
    in the judge's own process cannot tell it from an honest kernel; ``refcheck verify`` runs the candidate in a
    process of its own, where it gives its zeros (``tests/test_gaming.py``)."""
    import sys
    o, lse = naive.attention(q, k, v, **options)
    return (o, lse) if "refcheck.engine.laws" in sys.modules else (torch.zeros_like(o), lse)


def attention_detects_pytest(q, k, v, **options):
    """Correct while pytest's or Hypothesis' variables are in its environment (a test run), zeros elsewhere."""
    import os
    o, lse = naive.attention(q, k, v, **options)
    seen = any(name.startswith(("PYTEST", "HYPOTHESIS")) for name in os.environ)
    return (o, lse) if seen else (torch.zeros_like(o), lse)
