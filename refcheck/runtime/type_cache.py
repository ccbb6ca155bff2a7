"""Faster type bookkeeping for interpreted Triton kernels: the same objects, built with less work.

An interpreted kernel spends about half its time not computing but in ``triton.language``'s front
end, which builds a type object for every value of every operation of every program: a
``block_type`` per result (its shape unwrapped, validated and named again), a ``tensor`` whose
shape becomes a ``tuple`` of ``constexpr`` with a ``tuple_type`` made element by element, and
``_unwrap_if_constexpr`` checking a value against four classes before it returns it. The shapes a
kernel uses are few, so what they yield is computed once per shape here and reused; each replacement
builds objects equal, field by field, to what the stock code builds (fresh ``tuple`` objects, so
that no two values share a mutable list). The operands of a binary operation between two tensors
of one type skip the promotion, cast and broadcast that would return them unchanged
(``tests/test_interpreter.py`` holds this shortcut to the stock function over every pair of types,
shapes and flags). Results do not change, only time: an interpreted kda law test took 25 s before
the type objects were cached, 18 s after; the operand shortcut takes another 7% off two law tests
over interpreted kda and gla. A broadcast of two scalars, or of two blocks of one shape, returns them without
building the broadcast shape (``tests/test_interpreter.py`` holds it to the stock function too): FLA's kernels
make many such calls, and the report's grid over kda/fla_chunk took 31 -> 29 worker-seconds.

``patches()`` gives ``(owner, name, replacement)`` for ``refcheck.runtime.interpreter``'s patch
table, which installs them with its own and restores them on ``disable()``; ``SIGNATURES`` the
parameters each original must have (checked there, as for every patch).
"""
from __future__ import annotations

import builtins
import math
from typing import Any

SIGNATURES = {
    "_unwrap_if_constexpr": ["o"],
    "tensor.__init__": ["self", "handle", "type"],
    "block_type.__init__": ["self", "element_ty", "shape"],
    "TritonSemantic.binary_op_type_checking_impl": ["self", "lhs", "rhs", "allow_lhs_ptr", "allow_rhs_ptr",
                                                    "arithmetic_check", "div_or_mod"],
    "TritonSemantic.broadcast_impl_value": ["self", "lhs", "rhs"],
}
"""The parameters of each original, by ``owner.name`` (``_unwrap_if_constexpr``: a function of
``triton.language.core``)."""

_SCALARS = (int, float, bool, str, type(None))


def patches() -> list[tuple[Any, str, Any]]:
    """The replacements, as ``(owner, attribute, replacement)``; each one's original is
    ``owner.__dict__[attribute]``."""
    import triton.language.core as core

    stock_unwrap = core._unwrap_if_constexpr
    constexpr, tuple_ = core.constexpr, core.tuple
    stock_block_init = core.block_type.__init__

    def unwrap(o):
        # stock: list, builtins.tuple, tuple, then constexpr, by isinstance; the exact classes that make up
        # nearly every call are answered first, the rest (subclasses, containers) by the stock function
        kind = type(o)
        if kind is constexpr:
            return o.value
        if kind in _SCALARS:
            return o
        return stock_unwrap(o)

    shapes: dict[builtins.tuple, tuple] = {}

    def tensor_init(self, handle, type):
        # stock: shape, numel and a tuple of constexpr with its tuple_type, all rebuilt per value
        self.handle = handle
        self.type = type
        self.dtype = type.scalar
        shape = builtins.tuple(type.shape) if type.is_block() else ()
        known = shapes.get(shape)
        if known is None:
            items = [constexpr(s) for s in shape]
            known = shapes[shape] = (items, core._type_for_tuple_values(items), constexpr(math.prod(shape)))
        items, items_type, numel = known
        self.numel = numel
        self.shape = tuple_(items, items_type)

    blocks: dict[tuple, tuple] = {}

    def block_init(self, element_ty, shape):
        # stock: unwrap the shape, check each dimension is a power of 2 and the total within Triton's
        # limit, name the type; for a shape of plain ints seen before with this element type (a list, a
        # tuple, or another block type's shape: a triton tuple of ints), the result of the first time (a
        # shape with constexprs, or one that fails the checks, takes the stock path)
        key = None
        dims = shape.values if type(shape) is tuple_ else shape   # a block type's own shape (with_element_ty, to_ir)
        if isinstance(dims, (list, builtins.tuple)) and all(type(s) is int for s in dims):
            key = (type(element_ty), getattr(element_ty, "name", None), builtins.tuple(dims))
            known = blocks.get(key)
            if known is not None:
                self.element_ty = element_ty
                values, values_type, self.numel, self.name = known
                self.shape = tuple_(values, values_type)
                return
        stock_block_init(self, element_ty, shape)
        if key is not None and key[1] is not None:
            blocks[key] = (list(self.shape.values), self.shape.type, self.numel, self.name)

    from triton.language.semantic import TritonSemantic

    stock_operands = TritonSemantic.binary_op_type_checking_impl
    tensor = core.tensor

    def operands(self, lhs, rhs, allow_lhs_ptr=False, allow_rhs_ptr=False, arithmetic_check=True, div_or_mod=False):
        # stock: promote both operands to their computation type, cast each, broadcast their shapes; for two
        # tensors of one type that is not a pointer, every step returns its operands as they are (the
        # computation type of a type with itself is that type; a cast to its own type and a broadcast to
        # its own shape are no-ops), except division and modulo of floats narrower than fp32 (promoted)
        if type(lhs) is tensor and type(rhs) is tensor:
            left, right = lhs.type, rhs.type
            if left == right:
                scalar = left.scalar
                if not scalar.is_ptr() and not (div_or_mod and scalar.is_floating() and scalar.primitive_bitwidth < 32):
                    return lhs, rhs
        return stock_operands(self, lhs, rhs, allow_lhs_ptr, allow_rhs_ptr, arithmetic_check, div_or_mod)

    stock_broadcast = TritonSemantic.broadcast_impl_value

    def broadcast(self, lhs, rhs):
        # stock: for two scalars, return them; for two blocks, the broadcast shape dimension by dimension and each
        # operand broadcast to it where its shape differs (triton tuples compared with lists); for two blocks of one
        # shape that returns them as they are
        left, right = lhs.type, rhs.type
        if left.is_block() == right.is_block() and (not left.is_block() or left.shape.values == right.shape.values):
            return lhs, rhs
        return stock_broadcast(self, lhs, rhs)

    return [(core, "_unwrap_if_constexpr", unwrap), (core.tensor, "__init__", tensor_init),
            (core.block_type, "__init__", block_init), (TritonSemantic, "binary_op_type_checking_impl", operands),
            (TritonSemantic, "broadcast_impl_value", broadcast)]
