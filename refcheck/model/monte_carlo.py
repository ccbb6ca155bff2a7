"""Monte Carlo arithmetic: what rounding in a precision costs a computation, whatever its order.

Inside ``random_rounding(u, seed)`` every floating result of every arithmetic aten op (forward and
backward, since autograd's backward ops dispatch through the same mode) is perturbed as Monte Carlo
arithmetic perturbs it (Parker's MCA in its random-rounding mode, as Verificarlo and CADNA apply it
to C programs): a result ``y`` becomes

    y * (1 + u * xi),        xi ~ U[-1, 1], independent per element, seeded

with ``u`` the unit roundoff of the precision being modelled (``2^-8`` for bf16, ``2^-11`` for fp16,
``2^-24`` for fp32). What a kernel does inside one op rounds too, at the precision it does it in:

* a matrix product's terms ``a_k b_k`` come from operands rounded to the dot's precision (the input
  dtype, or tf32's ``2^-11`` for fp32 inputs in that mode): the result moves by
  ``u_dot * xi' * sqrt(sum_k (a_k b_k)^2)``;
* a reduction (a sum, a product, a cumulative sum) rounds every partial sum ``S_k`` it forms, in the
  float32 accumulator kernels use whatever their inputs: it moves by ``u_sum * xi'' * sqrt(sum_k S_k^2)``.

Both are the spread of ``sum_k delta_k t_k`` over independent roundings ``delta_k``: a sum of large
terms that cancel to a small result moves by the terms' size, not by its own (a one-op perturbation
alone would give a long dot the error of one rounding, and a cancelling sum almost none).

Ops that move data without arithmetic (views, copies, indexing, concatenation, ``where``, masks,
max/min, negation) are exact in every precision and are left alone; so are integer and boolean
results and non-finite entries (``inf`` stays ``inf``: the perturbation multiplies, it never adds
``inf * 0``).

Evaluated on float64 inputs, K seeded samples of a reference under this mode scatter around its
unperturbed result by what rounding in precision ``u`` costs on that very case: the yardstick of a
bound that holds for any correct kernel (``refcheck.engine.verify.monte_carlo_error``).
"""
from __future__ import annotations

import math
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


PARTIAL_SUMS_LIMIT = 2 ** 24
"""Elements of the partial sums a matrix product's spread is formed from, at most (``_product_partials``):
beyond it the inner dimension is taken in blocks (partial sums at block ends, as a tensor-core kernel
accumulates a tile of products at a time)."""


def _sum_partials(x: torch.Tensor, dims, keepdim: bool) -> torch.Tensor:
    """``sum_k S_k^2`` per output of ``x.sum(dims)``: the squares of its partial sums, added in index order."""
    dims = sorted(d % x.ndim for d in dims) if dims else list(range(x.ndim))
    rest = [d for d in range(x.ndim) if d not in dims]
    moved = x.permute(*rest, *dims).reshape(*[x.shape[d] for d in rest], -1)
    squares = moved.cumsum(-1).square().sum(-1)
    if keepdim:
        squares = squares.reshape([1 if d in dims else x.shape[d] for d in range(x.ndim)])
    return squares


def _product_partials(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``sum_k S_k^2`` per element of ``a @ b`` (``[..., M, K] @ [..., K, N]``), ``S_k`` the partial sums of its
    products in the order of k; in blocks of the inner dimension where ``PARTIAL_SUMS_LIMIT`` asks."""
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    batch = a.shape[:-2]
    block = max(1, math.ceil(math.prod(batch) * m * n * k / PARTIAL_SUMS_LIMIT))
    blocks = math.ceil(k / block)
    pad = blocks * block - k
    if pad:
        a = torch.nn.functional.pad(a, (0, pad))
        b = torch.nn.functional.pad(b, (0, 0, 0, pad))
    parts = torch.einsum("...mcs,...csn->...cmn", a.reshape(*batch, m, blocks, block), b.reshape(*batch, blocks, block, n))
    return parts.cumsum(-3).square().sum(-3) * block


def _term_squares(name: str, args, kwargs) -> torch.Tensor | None:
    """``sum_k (a_k b_k)^2`` per element of a matrix product: the size of its products, each computed from
    operands rounded to the dot's precision (None for an op that is no product)."""
    if name in ("mm", "bmm"):
        return _product(name, args[0].square(), args[1].square())
    if name == "mv":
        return aten.mv(args[0].square(), args[1].square())
    if name == "dot":
        return aten.dot(args[0].square(), args[1].square())
    if name in ("addmm", "baddbmm"):
        alpha = kwargs.get("alpha", 1)
        return _product(name, args[1].square(), args[2].square()) * (alpha * alpha)
    return None


def _product(name: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return aten.mm(a, b) if name in ("mm", "addmm") else aten.bmm(a, b)


def _partial_squares(name: str, args, kwargs, result: torch.Tensor) -> torch.Tensor | None:
    """``sum_k S_k^2`` per element of a reduction's ``result``: the squares of the partial sums its terms
    are added through (None for an op that adds no terms). Rounding each partial sum in turn moves the
    result by ``sum_k delta_k S_k``, whose spread is ``u sqrt(sum_k S_k^2)``: a sum of large terms that
    cancel to a small result still moves by the terms' size."""
    if name in ("sum", "mean"):
        x = args[0]
        dims = args[1] if len(args) > 1 else kwargs.get("dim")
        keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
        squares = _sum_partials(x, dims, keepdim)
        if name == "mean":   # the terms are x / n
            squares = squares / max(1, x.numel() // max(1, result.numel())) ** 2
        return squares.reshape(result.shape) if squares.numel() == result.numel() else None
    if name in ("mm", "bmm"):
        return _product_partials(args[0], args[1])
    if name == "mv":
        return _product_partials(args[0], args[1].unsqueeze(-1)).squeeze(-1)
    if name == "dot":
        return _product_partials(args[0].unsqueeze(0), args[1].unsqueeze(-1)).reshape(())
    if name in ("addmm", "baddbmm"):
        c, a, b = args[:3]
        beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
        products = _product_partials(a, b) * (alpha * alpha)
        return products + torch.broadcast_to(c * beta, products.shape).square()
    if name == "cumsum":   # its results are its partial sums
        return result.square().cumsum(args[1] if len(args) > 1 else kwargs["dim"])
    return None


class RandomRounding(TorchDispatchMode):
    """The dispatch mode of ``random_rounding``: perturbs every inexact floating result."""

    def __init__(self, unit_roundoff: float, seed: int, dot_roundoff: float | None = None,
                 accumulation_roundoff: float = 2.0 ** -24):
        super().__init__()
        self.u = unit_roundoff
        self.u_dot = unit_roundoff if dot_roundoff is None else dot_roundoff
        self.u_sum = accumulation_roundoff
        self.gen = torch.Generator().manual_seed(seed)

    def _noise(self, like: torch.Tensor, u: float) -> torch.Tensor:
        """``u * xi`` per element, ``xi ~ U[-1, 1]`` from the mode's generator (on the CPU: seeded alike
        whatever the tensor's device)."""
        return torch.empty(like.shape, dtype=like.dtype).uniform_(-u, u, generator=self.gen).to(like.device)

    def _moved(self, out: torch.Tensor, squares: torch.Tensor | None, u: float) -> torch.Tensor:
        """``out + u xi sqrt(squares)`` where that is finite (``out`` unchanged without ``squares``)."""
        if squares is None or squares.shape != out.shape:
            return out
        step = squares.clamp_min(0).sqrt_().mul_(self._noise(out, u))
        if bool(torch.isfinite(step).all()):
            return out.add_(step)
        return torch.where(torch.isfinite(out) & torch.isfinite(step), out + step, out)

    def _rounded(self, name: str, args, kwargs, result: torch.Tensor) -> torch.Tensor:
        """One sample of ``result`` rounded: times ``1 + u xi``; a product's terms each by the dot's
        roundoff, and a reduction's partial sums by the accumulation's (``_partial_squares``)."""
        out = result * self._noise(result, self.u).add_(1)
        if name in DOTS:
            out = self._moved(out, _term_squares(name, args, kwargs), self.u_dot)
        if name in REDUCTIONS:
            out = self._moved(out, _partial_squares(name, args, kwargs, result), self.u_sum)
        return out

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        if func.is_view or name in EXACT or name.endswith("_copy"):
            return result
        if isinstance(result, torch.Tensor):
            if not result.is_floating_point() or result.numel() == 0:
                return result
            rounded = self._rounded(name, args, kwargs, result)
            if func._schema.is_mutable or name.endswith("_"):   # in place: write the rounded value back
                with torch.no_grad():
                    result.copy_(rounded)
                return result
            return rounded
        if isinstance(result, (tuple, list)):
            return type(result)(r * self._noise(r, self.u).add_(1) if isinstance(r, torch.Tensor)
                                and r.is_floating_point() and r.numel() else r for r in result)
        return result


DOTS = frozenset({"mm", "bmm", "matmul", "dot", "mv", "addmm", "baddbmm", "linalg_solve_triangular",
                  "triangular_solve"})
"""Products that run on tensor cores in a kernel: rounded at the dot precision (tf32 in that mode)."""
REDUCTIONS = frozenset({"sum", "mean", "mm", "bmm", "dot", "mv", "addmm", "baddbmm", "cumsum"})
"""Ops that add many terms through partial sums, each rounded (``_partial_squares``)."""


@contextmanager
def random_rounding(unit_roundoff: float, seed: int, dot_roundoff: float | None = None,
                    accumulation_roundoff: float = 2.0 ** -24):
    """One Monte Carlo sample of rounding, seeded: inside the block every inexact floating result is
    rounded at ``unit_roundoff``, the products of ``DOTS`` from operands rounded at ``dot_roundoff``
    (default ``unit_roundoff``), and the partial sums of every reduction at ``accumulation_roundoff``
    (float32's: kernels accumulate dots and sums in float32 whatever their inputs)."""
    with RandomRounding(unit_roundoff, seed, dot_roundoff, accumulation_roundoff):
        yield
