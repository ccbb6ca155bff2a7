"""Monte Carlo arithmetic: what rounding in a precision costs a computation, whatever its order.

Inside ``random_rounding(u, seed)`` every floating result of every arithmetic aten op (forward and
backward, since autograd's backward ops dispatch through the same mode) is perturbed as Monte Carlo
arithmetic perturbs it (Parker's MCA in its random-rounding mode, as Verificarlo and CADNA apply it
to C programs): a result ``y`` becomes

    y * (1 + u * xi),        xi ~ U[-1, 1], independent per element, seeded

with ``u`` the unit roundoff of the precision being modelled (``2^-8`` for bf16, ``2^-11`` for fp16
and tf32 dots, ``2^-24`` for fp32). An op that reduces terms (a sum, a matrix product, a cumulative
sum) rounds every term it adds, so its result also moves by ``u * xi' * sqrt(sum of the terms'
squares)``: the spread of ``sum_k t_k delta_k`` over independent roundings ``delta_k`` of each
term, whatever order a kernel adds them in (a one-op perturbation alone would let a sum of large
terms that cancel come out with the tiny error of its tiny result).

Ops that move data without arithmetic (views, copies, indexing, concatenation, ``where``, masks,
max/min, negation) are exact in every precision and are left alone; so are integer and boolean
results and non-finite entries (``inf`` stays ``inf``: the perturbation multiplies, it never adds
``inf * 0``).

Evaluated on float64 inputs, K seeded samples of a reference under this mode scatter around its
unperturbed result by what rounding in precision ``u`` costs on that very case: the yardstick of a
bound that holds for any correct kernel (``refcheck.engine.verify.monte_carlo_error``).
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

EXACT = frozenset({
    # data movement: copies, layout, indexing, concatenation, padding, selection, fills
    "alias", "clone", "copy", "copy_", "_to_copy", "to", "detach", "lift_fresh", "lift_fresh_copy", "contiguous",
    "cat", "stack", "index", "index_select", "gather", "scatter", "index_put", "index_put_", "_index_put_impl_",
    "masked_fill", "masked_fill_", "masked_scatter", "where", "select_scatter", "slice_scatter", "diagonal_scatter",
    "as_strided_scatter", "constant_pad_nd", "flip", "roll", "repeat", "repeat_interleave", "tril", "triu",
    "zeros", "zeros_like", "ones", "ones_like", "full", "full_like", "new_zeros", "new_ones", "new_full",
    "new_empty", "new_empty_strided", "empty", "empty_like", "empty_strided", "fill", "fill_", "zero_", "arange",
    "_unsafe_view", "unfold", "split_with_sizes_copy", "view_copy", "permute_copy", "t_copy", "transpose_copy",
    "expand_copy", "unsqueeze_copy", "squeeze_copy", "select_copy", "slice_copy", "_unsafe_index", "take",
    "embedding", "embedding_dense_backward", "set_", "resize_", "narrow_copy", "diag_embed",
    # exact arithmetic: sign, magnitude, order
    "neg", "abs", "sign", "sgn", "max", "min", "amax", "amin", "maximum", "minimum", "clamp", "clamp_min",
    "clamp_max", "relu", "threshold_backward", "sort", "topk", "cummax", "cummin", "nan_to_num", "floor", "ceil",
    "round", "trunc", "masked_select", "nonzero", "isnan", "isinf", "isfinite", "isneginf", "isposinf",
    "logical_not", "logical_and", "logical_or", "eq", "ne", "lt", "le", "gt", "ge", "bitwise_and",
    "bitwise_or", "bitwise_not", "_local_scalar_dense", "item", "equal", "any", "all", "argmax", "argmin",
    "value_selecting_reduction_backward", "max_pool2d_with_indices", "signbit",
})
"""aten op names (overload packets) whose results are exact: never perturbed."""


def _sum_squares(func, args, kwargs) -> torch.Tensor | None:
    """``sum of the terms' squares`` of a reduction ``func(*args)``, computed by the same reduction
    of the squared operands (None for an op that adds no terms)."""
    name = func.overloadpacket.__name__
    if name in ("sum", "mean"):
        x = args[0]
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            return None
        out = func(x.square(), *args[1:], **kwargs)
        if name == "mean":   # mean = sum / n: its terms are x / n
            n = max(1, x.numel() // max(1, out.numel()))
            out = out / n
        return out
    if name in ("mm", "bmm", "matmul", "dot", "mv"):
        return func(args[0].square(), args[1].square())
    if name in ("addmm", "baddbmm"):
        c, a, b = args[:3]
        beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
        inner = aten.mm if name == "addmm" else aten.bmm
        products = inner(a.square(), b.square()) * (alpha * alpha)
        return products + torch.broadcast_to(c.square() * (beta * beta), products.shape)
    if name == "cumsum":
        return func(args[0].square(), *args[1:], **kwargs)
    return None


class RandomRounding(TorchDispatchMode):
    """The dispatch mode of ``random_rounding``: perturbs every inexact floating result."""

    def __init__(self, unit_roundoff: float, seed: int, dot_roundoff: float | None = None):
        super().__init__()
        self.u = unit_roundoff
        self.u_dot = unit_roundoff if dot_roundoff is None else dot_roundoff
        self.gen = torch.Generator().manual_seed(seed)

    def _noise(self, like: torch.Tensor) -> torch.Tensor:
        xi = torch.rand(like.shape, generator=self.gen, dtype=torch.float64) * 2 - 1
        return xi.to(like.device, like.dtype)

    def _perturb(self, y: torch.Tensor, u: float, squares: torch.Tensor | None) -> torch.Tensor:
        out = y * (1 + u * self._noise(y))
        if squares is not None and squares.shape == y.shape:
            spread = u * squares.clamp_min(0).sqrt() * self._noise(y)
            out = torch.where(torch.isfinite(out) & torch.isfinite(spread), out + spread, out)
        return out

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        if func.is_view or name in EXACT or name.endswith("_copy"):
            return result
        u = self.u_dot if name in DOTS else self.u
        if isinstance(result, torch.Tensor):
            if not result.is_floating_point() or result.numel() == 0:
                return result
            squares = _sum_squares(func, args, kwargs) if name in REDUCTIONS else None
            perturbed = self._perturb(result, u, squares)
            if func._schema.is_mutable or name.endswith("_"):   # in place: write the perturbed value back
                with torch.no_grad():
                    result.copy_(perturbed)
                return result
            return perturbed
        if isinstance(result, (tuple, list)):
            return type(result)(self._perturb(r, u, None) if isinstance(r, torch.Tensor) and r.is_floating_point()
                                and r.numel() else r for r in result)
        return result


DOTS = frozenset({"mm", "bmm", "matmul", "dot", "mv", "addmm", "baddbmm", "linalg_solve_triangular",
                  "triangular_solve"})
"""Products that run on tensor cores in a kernel: rounded at the dot precision (tf32 in that mode)."""
REDUCTIONS = frozenset({"sum", "mean", "mm", "bmm", "matmul", "dot", "mv", "addmm", "baddbmm", "cumsum"})
"""Ops that add many terms, each rounded (``_sum_squares``)."""


@contextmanager
def random_rounding(unit_roundoff: float, seed: int, dot_roundoff: float | None = None):
    """Inside the block every inexact floating result is perturbed by ``unit_roundoff`` (products of
    ``DOTS`` by ``dot_roundoff`` where given): one Monte Carlo sample of rounding, seeded."""
    with RandomRounding(unit_roundoff, seed, dot_roundoff):
        yield
