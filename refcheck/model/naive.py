"""The naive implementations: each op's reference evaluated in the input dtype.

Two forms: recurrent (``refcheck.model.naive:OP``: the reference as written) and, for the ops with a
chunk form, chunked (``refcheck.model.naive:OP_chunked``: the linear ops in chunks of 64 with the
in-chunk decays formed from differences of the cumulative log-decay, as kernels form them, so that they
share the kernels' cancellation under steep decays; attention in the flash form, whose backward forms
``dP - D``). The larger of their errors is the yardstick of the contract
bounds ("at most F times the error of the same computation done naively in the input dtype",
``refcheck.engine.verify.yardstick``); both are also implementations every law runs over.
Outputs follow the contract: the first (``o``, ``gate``) in the input dtype as computed, states and
``lse`` in float32. Any op's naive forms are made from its card: ``refcheck.model.naive:gla`` is
``naive_form("gla")``.
"""
from __future__ import annotations

from collections.abc import Callable

from .ops import card

CHUNKED = "_chunked"


def naive_form(op: str, chunked: bool = False) -> Callable:
    """The reference of ``op`` (its chunk form with differenced decays when ``chunked``) with the
    contract's output dtypes: every output after the first in float32; a single output in float32
    (a gate)."""
    c = card(op)
    if chunked and c.chunked_reference is None:
        raise AttributeError(f"op {op!r} has no chunk form")

    fn = c.form("chunked" if chunked else "recurrent")

    def naive(*args, **options):
        result = fn(*args, **options)
        if not isinstance(result, tuple):
            return result.float()
        first, *rest = result
        return (first, *(None if x is None else x.float() for x in rest))
    naive.__name__ = op + (CHUNKED if chunked else "")
    naive.__qualname__ = naive.__name__
    return naive


def fp8_attention(held: dict, **options) -> tuple:
    """The naive yardstick of attention's fp8 budgets: ``(o, lse)`` of the values an fp8 forward's inputs
    hold (``ops.attention.fp8_inputs``, float64) dequantized to bf16, then the bf16 naive form (o in bf16,
    lse in float32) -- the same computation done naively."""
    bf16 = {name: x.bfloat16() if x.is_floating_point() else x for name, x in held.items()}
    return naive_form("attention")(**bf16, **options)


def __getattr__(name: str) -> Callable:
    """``refcheck.model.naive:OP`` and ``refcheck.model.naive:OP_chunked`` for every known op."""
    chunked = name.endswith(CHUNKED)
    op = name[:-len(CHUNKED)] if chunked else name
    try:
        return naive_form(op, chunked)
    except ValueError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
