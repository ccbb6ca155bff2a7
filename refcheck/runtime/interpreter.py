"""Faithful Triton interpreter: make ``TRITON_INTERPRET=1`` runs compute what a Hopper GPU computes.

Out of the box the interpreter of triton 3.9 ignores ``tl.dot``'s ``input_precision``, multiplies the
raw bit patterns of bf16 operands, truncates float casts that the GPU rounds, and cannot run an
``@triton.autotune`` kernel with more than one config (it tries to benchmark, "0 active drivers").
It also departs from what the compiler makes of a kernel: loop indices are Python ints, builtins
under another name are not builtins, bf16 arithmetic works on the bit patterns, float arguments are
Python numbers, and ``tl.dot`` refuses "bf16x3"/"bf16x6" (flash-linear-attention's kernels hit every
one of these). :func:`enable` replaces the interpreter internals responsible; each replacement
says what the GPU or the compiler does and how we know. What the compiler refuses before anything runs
(a loop-carried value whose type changes, say) the interpreter does not see: ``frontend`` puts captured
launches through the compiler's front end on the CPU (``tests/test_frontend.py``). :func:`enable`
also installs ``type_cache``'s replacements, which build the front end's type objects once per shape
(speed only: the same objects, the same results).

Switching interpretation on (triton 3.9)
----------------------------------------
Triton decides *when a function is decorated* whether it is compiled or interpreted: ``@triton.jit``
reads ``triton.knobs.runtime.interpret``, i.e. the environment variable ``TRITON_INTERPRET``
(``1``/``true``/``on``/``yes``, any case), at that moment. triton's own library functions
(``tl.sum``, ``tl.max``, ``tl.zeros``, ``tl.cdiv``, ``tl.sigmoid``, ``tl.cumsum``, ... about 40, all
``@jit`` in ``triton.language.standard``) are decorated when triton is first imported. So
``TRITON_INTERPRET=1`` must be set **before the first ``import triton``** in the process; set later,
kernels that use only builtins run, but any call of those library functions fails with "Cannot call
@triton.jit'd outside of the scope of a kernel". :func:`interpret_new_kernels` sets it and raises if
triton was already imported compiled. This module imports triton only inside its functions.
:func:`enable` only changes how interpreted kernels compute; call it before launching them.

Public API
----------
``SUPPORTED_VERSIONS``       triton version prefixes :func:`enable` accepts (("3.9.",)).
``UnsupportedTritonError``   raised by :func:`enable` (a RuntimeError) for any other triton, or when
                             an internal it replaces is missing or has another signature.
``enable()``                 install the faithful patches (idempotent); raises
                             :class:`UnsupportedTritonError` on a triton this module was not checked on.
``disable()``                restore the stock interpreter (idempotent).
``is_enabled()``             whether the patches are installed.
``is_interpreted(kernel=None)``  with a kernel: whether that kernel (jit, autotuned or heuristics
                             wrapper) runs in the interpreter; without: whether kernels defined from
                             now on will.
``interpret_new_kernels()``  set ``TRITON_INTERPRET=1`` so that kernels defined from now on are
                             interpreted; raises if triton was already imported without it.
``configs(kernel)``          the configs of an ``@triton.autotune`` kernel.
``pin_config(kernel, config)``  context manager: every launch of ``kernel`` inside it uses ``config``
                             (an index into ``configs(kernel)`` or one of its elements), pruning
                             bypassed.
``each_config(kernel)``      iterate over ``configs(kernel)`` with each one pinned in turn, so a test
                             can run the same op under every config and compare.

Semantics after ``enable()`` (Hopper, sm_90; "measured" = bitwise equal to an H200 running
triton 3.6 on the probes of benchmarks/interpreter_calibration.py and on wider random draws)
----------------------------------------------------------------------------------------------
* ``tl.dot``, operands ``a`` [..., M, K] and ``b`` [..., K, N], accumulator ``c`` [..., M, N]. For fp32
  operands ``input_precision`` decides (Triton's front end has already resolved the default:
  ``TRITON_F32_DEFAULT``, else ``allow_tf32``, else "tf32"):
  - "ieee": ``c <- fma(a[:, k], b[k, :], c)`` in float32 for k = 0, 1, ...: Triton lowers an fp32 ieee
    dot to FMA instructions. Measured.
  - "tf32": operands truncated to 10 mantissa bits (the tensor core drops the low 13 bits of the
    fp32 register; Triton's ``tl.dot`` docstring warns of it), then the tensor-core sum below.
    Measured.
  - "tf32x3": Triton's F32DotTC pass (lib/Dialect/TritonGPU/Transforms/F32DotTC.cpp):
    ``hi = cvt.rna.tf32(x)`` (nearest, ties away), ``lo = x - hi``; ``s = dot_tf32(lo_a, hi_b, 0)``,
    ``s = dot_tf32(hi_a, lo_b, s)``, NaN in ``s`` replaced by 0, result ``dot_tf32(hi_a, hi_b, s) + c``
    (``lo`` is truncated again by the tf32 dot). Measured.
  bf16, fp16, fp8 e4m3 (``tl.float8e4nv``) and e5m2 (``tl.float8e5``) operands: decoded exactly and
  summed by the tensor core as below; ``input_precision`` does not apply (as on the GPU).
  The tensor-core sum, fitted on the H200 and then measured bitwise equal on every probe: one
  instruction takes 8 (tf32), 16 (bf16, fp16) or 32 (fp8) values of k; the products are exact; every
  product (its exponent is the sum of the operands' exponent fields, subnormals counting as the
  smallest) and the accumulator are truncated toward zero at 25 bits below the largest exponent
  among them, added exactly, and the sum is truncated to float32 (with ``out_dtype=tl.float16``:
  rounded to nearest float16). fp8 dots with M >= 64 run on wgmma with Triton's sm_90 default
  ``max_num_imprecise_acc`` (2**30): the whole sum stays in the tensor core, whose fp8 accumulator
  keeps 13 mantissa bits (align 13, result truncated to 13 bits). fp8 dots with M < 64 (mma.sync)
  are approximated by the 25-bit rule (89-90% of outputs bitwise equal, same error size); an explicit
  ``max_num_imprecise_acc`` is not modelled. int8 and fp64 dots are left to the stock interpreter.
* Float casts round to nearest, ties to even, with IEEE overflow to Inf (NaN for e4m3, which has no
  Inf), as PTX ``cvt.rn`` does; ``fp_downcast_rounding="rtz"`` truncates. Measured, with the special
  values below. A conversion *to fp8*
  through ``.to()`` saturates: Triton emits ``cvt.rn.satfinite.{e4m3,e5m2}x2`` on sm_90
  (third_party/nvidia/lib/TritonNVIDIAGPUToLLVM/ElementwiseOpToLLVM.cpp), so finite values beyond
  the largest fp8 value and +-Inf become +-max. NaN is written as the PTX canonical NaN (0x7FFF for
  bf16/fp16, 0x7F for fp8). Integer <-> bf16/fp8 casts use the values, not the stored bit patterns.
* ``tl.dot`` of fp32 operands with ``input_precision`` "bf16x3" / "bf16x6" (the nvidia backend allows
  them; the stock interpreter's options do not): Triton's BF16xN pattern (F32DotTC.cpp, Triton >= 3.6):
  each operand split into ``hi = bf16(x)`` (nearest even), ``mid = bf16(x - hi)``, ``lo = bf16(x - hi
  - mid)``; bf16 tensor-core dots (the rule above) chained from 0: bf16x6 ``mid*mid``, ``lo*hi``,
  ``hi*lo``, then ``mid*hi``, ``hi*mid``, NaN replaced by 0, ``hi*hi``; the result added to ``c`` in
  float32. Derived from the pass's source and the measured bf16 rule; bf16x3 measured bitwise equal on an
  H100 (``benchmarks/interpreter_calibration.py``'s ``dot/fp32-bf16x3`` probes), bf16x6 not measured.
* Loop indices: the index of ``for i in range(...)`` and ``tl.range(...)`` is a scalar tensor of the
  bounds' promoted integer type (int32 for Python ints that fit), as the compiler's
  ``code_generator.visit_For`` makes it: ``i.to(tl.int64)`` works and ``i * BT`` wraps in int32 as on
  the GPU. ``tl.static_range`` indices stay Python ints (constexpr). Stock: all are Python ints.
* Integer add, sub and mul wrap, with no overflow check computed: the GPU's compiler drops the checks
  (``debug`` off), whose assert the stock interpreter drops as well, but only after computing each of them
  again in int64 (``sanitize_overflow``: a fifth of an interpreted kda law's time, 21.2 -> 16.9 s).
* Builtins under another name (``gather = tl.gather`` in the kernel's module) are builtins, as in the
  compiler's ``visit_Call``, which looks at the object, not the name. Stock: only the attributes of
  ``tl``, ``tl.core``, ``tl.math`` and ``tl.tensor`` are, and an alias raises "Did you forget to add
  @triton.jit ?".
* bf16 arithmetic works on values: add, sub, mul, div, min/max, comparisons, negation and ``tl.fma``
  round the exact result to nearest even bf16 (computed in float64 and rounded once: 53 >= 2*8 + 2
  bits, so the double rounding is innocuous, as sm_90's ``add.rn.bf16``/``fma.rn.bf16`` and the
  float32 route agree); math functions of bf16 are computed in float32 and rounded (Triton upcasts
  them). ``tl.sum`` of bf16 (kept in bf16 by triton.language.standard.sum) adds pairwise along the
  axis, each addition rounded to bf16; ``tl.cumsum`` sequentially, each addition rounded; max/min
  compare values. The GPU rounds each addition the same way, but its order depends on the layout
  (per thread, then a butterfly across lanes): reductions are not bitwise. Stock: numpy on the
  uint16 codes (1.0 + 1.0 is a sum of two integers).
* fp32 ``tl.exp2`` flushes a subnormal result to zero and fp32 ``tl.sqrt`` a subnormal input (the
  ``math_specials`` probes, H200: ``exp2(-130) = 0``, ``sqrt(2^-130) = 0``); ``tl.log2``, ``*``, ``/`` and
  ``+`` keep subnormals exactly, as numpy does. Measured. (KDA's prepared scales were once
  ``exp2(ceil(log2(m)))``: zero on the GPU for a row decayed below 2^-126, exact here.) Stock: numpy's
  subnormals.
* ``libdevice`` functions (``triton.language.extra.libdevice``; today ``tanh``, which attention's softcap
  calls) are computed by numpy on the fp32 or fp64 values (``LIBDEVICE``); on the GPU ``__nv_tanhf`` is
  within 2 ulp of the exact tanh, numpy's as well, not bitwise the same. Stock: the stub's body, None.
* A Python float kernel argument is an fp32 scalar tensor (``jit.mangle_type`` types it "fp32"), so
  ``x * scale`` with a bf16 ``x`` is computed in fp32. Stock: a Python number, which Triton's
  promotion treats as a literal taking the tensor's dtype.
* ``@triton.autotune`` kernels run without a driver: with no pin, the first config left after the
  kernel's own pruning (``early_config_prune``, ``perf_model``) is used and cached per key as the GPU
  caches its winner. No benchmark runs, so the ``reset_to_zero`` reset that the GPU applies once
  after benchmarking does not happen: every launch behaves like a cached GPU launch.
* ``tl.dot`` shapes: the compiler refuses a dot whose operands are too small for the tensor cores,
  "Input shapes should have M >= 1, N >= 1 and K >= 16" (the nvidia backend's ``min_dot_size``,
  asked for sm_90; this triton: K >= 32 for 8-bit operands, 16 for 16-bit, 8 for fp32; triton 3.6:
  16 for everything not 8-bit). Seen on an H100: flash-linear-attention's ``chunk_gla`` backward at
  V = 1 (a [64, 1] by [1, 64] dot). Stock: any shape, (1, 1, 1).
* Memory: every load and store of an active lane (mask true) must fall inside the storage of one of
  the kernel's tensor arguments, else the launch raises "illegal memory access" naming the access
  and the nearest argument. On a GPU such an access reads another tensor's memory (past a row, past
  the end) or, past the allocation, kills the CUDA context ("an illegal memory access was
  encountered"). Stock: the host address is read or written, whatever it holds. Atomics are not
  checked. An access the compiler makes on its own is out of reach: the illegal address our GLA
  kernels made on an H100 came from Triton 3.6's code for 16-wide tf32x3 dots at 8 warps
  (``benchmarks/results/gpu_gla_k16_h100.txt``), and this check passes them.
"""
from __future__ import annotations

import dataclasses
import inspect
import os
import sys
import warnings
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from typing import Any, NamedTuple

import numpy as np

from . import type_cache

SUPPORTED_VERSIONS = ("3.9.",)
"""Triton versions (prefixes) whose interpreter internals this module was checked against."""

_FP8 = ("fp8e4nv", "fp8e5")
_STOCK: dict[tuple[Any, str], object] = {}   # (owner, patched attribute) -> original
_STOCK_BY_NAME: dict[str, object] = {}          # attribute -> original, for the replacements that call it
_PINNED: weakref.WeakKeyDictionary[object, object] = weakref.WeakKeyDictionary()


class UnsupportedTritonError(RuntimeError):
    """The installed triton is not one whose interpreter this module knows how to patch."""


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------

def enable() -> None:
    """Make the interpreter faithful (see the module docstring). Idempotent."""
    if _STOCK:
        return
    _check_import_order()
    from triton.runtime import autotuner
    from triton.runtime import interpreter as stock

    # numpy warns where a GPU computes IEEE special values in silence: exp overflowing to inf (a steep
    # decay is valid input), NaN from a NaN operand (the poisoned margins of reads_past_input)
    warnings.filterwarnings("ignore", "(overflow|invalid value) encountered", RuntimeWarning, "triton.runtime.interpreter")
    patches = _patch_table(stock, autotuner)
    for owner, name, _ in patches:
        _STOCK[(owner, name)] = _STOCK_BY_NAME[name] = owner.__dict__[name]
    for owner, name, replacement in patches:
        setattr(owner, name, replacement)
    _forget_rewrites()


def disable() -> None:
    """Restore the stock interpreter. Idempotent."""
    while _STOCK:
        (owner, name), original = _STOCK.popitem()
        setattr(owner, name, original)
    _STOCK_BY_NAME.clear()
    _forget_rewrites()


def _forget_rewrites() -> None:
    """Drop the interpreter's cache of rewritten kernel sources, so that each kernel is rewritten
    by the transformation now in effect (``_transform_ast``) on its next launch."""
    if "triton.runtime.interpreter" in sys.modules:
        sys.modules["triton.runtime.interpreter"].InterpretedFunction.rewritten_fn.clear()


def is_enabled() -> bool:
    """Whether :func:`enable` is in effect."""
    return bool(_STOCK)


def is_interpreted(kernel=None) -> bool:
    """With ``kernel`` (a jit function, possibly wrapped by autotune/heuristics): whether it runs in
    the interpreter. Without: whether kernels defined from now on will (``TRITON_INTERPRET``)."""
    import triton

    if kernel is None:
        return bool(triton.knobs.runtime.interpret)
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(_base_kernel(kernel), InterpretedFunction)


def interpret_new_kernels() -> None:
    """Set ``TRITON_INTERPRET=1`` for this process (and its children): kernels defined from now on
    are interpreted; kernels already defined are not affected. RuntimeError if triton was imported
    before without it (its library functions are compiled then; see the module docstring)."""
    os.environ["TRITON_INTERPRET"] = "1"
    _check_import_order()


def _check_import_order() -> None:
    """Under TRITON_INTERPRET, triton's own jit functions must be interpreted too."""
    standard = sys.modules.get("triton.language.standard")
    if standard is None or not is_interpreted():
        return
    from triton.runtime.jit import JITFunction

    compiled = [name for name, value in vars(standard).items() if type(value) is JITFunction]
    if compiled:
        raise RuntimeError(
            "TRITON_INTERPRET=1 was set after triton was imported: triton's own jit functions "
            f"({', '.join(compiled[:4])}, ...) are compiled and fail inside interpreted kernels; "
            "set TRITON_INTERPRET=1 before the first `import triton` of the process")


def configs(kernel) -> list:
    """The ``triton.Config`` list of an ``@triton.autotune`` kernel (possibly under heuristics)."""
    return list(_autotuner(kernel).configs)


@contextmanager
def pin_config(kernel, config):
    """Inside the block every launch of the autotuned ``kernel`` uses ``config``: an index into
    :func:`configs` or one of its elements. Pruning is bypassed; the kernel's config cache is
    emptied on entry and restored on exit. Needs :func:`enable` and an interpreted kernel."""
    tuner = _autotuner(kernel)
    if not is_enabled():
        raise RuntimeError("pin_config needs refcheck.runtime.interpreter.enable() first")
    if not is_interpreted(tuner):
        raise ValueError("kernel: expected an interpreted kernel (define it with TRITON_INTERPRET=1)")
    if isinstance(config, int):
        if not 0 <= config < len(tuner.configs):
            raise ValueError(f"config: expected an index in [0, {len(tuner.configs)}), got {config}")
        config = tuner.configs[config]
    elif not any(config is c for c in tuner.configs):
        raise ValueError(f"config: expected an index or one of configs(kernel), got {config}")
    if tuner in _PINNED:
        raise RuntimeError("pin_config: this kernel is already pinned")
    saved = dict(tuner.cache)
    tuner.cache.clear()
    _PINNED[tuner] = config
    try:
        yield config
    finally:
        del _PINNED[tuner]
        tuner.cache.clear()
        tuner.cache.update(saved)


def each_config(kernel) -> Iterator:
    """Yield each config of the autotuned ``kernel`` while it is pinned::

        outputs = [op(x) for _ in interpreter.each_config(kernel)]
    """
    for config in configs(kernel):
        with pin_config(kernel, config):
            yield config


# ---------------------------------------------------------------------------------------------
# Number formats: exact decoding and correctly rounded encoding of the formats stored as bits
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Format:
    """A float format of ``bits`` <= 16 bits: sign, exponent (``bias``), ``mantissa`` bits. Codes
    ``0..max_code`` are the finite non-negative values in increasing order; ``inf_code`` is +Inf
    (None: the format has none), ``nan_code`` the NaN the GPU writes."""
    bits: int
    mantissa: int
    bias: int
    max_code: int
    inf_code: int | None
    nan_code: int
    storage: type

    @cached_property
    def values(self) -> np.ndarray:
        """float64 value of every code 0 .. 2**bits - 1 (exact: at most 11 significant bits)."""
        codes = np.arange(1 << self.bits, dtype=np.int64)
        magnitude = codes & ((1 << (self.bits - 1)) - 1)
        exponent = magnitude >> self.mantissa
        fraction = magnitude & ((1 << self.mantissa) - 1)
        value = np.where(exponent == 0, np.ldexp(fraction.astype(np.float64), 1 - self.bias - self.mantissa),
                         np.ldexp((fraction + (1 << self.mantissa)).astype(np.float64),
                                  exponent - self.bias - self.mantissa))
        value[magnitude > self.max_code] = np.nan
        if self.inf_code is not None:
            value[magnitude == self.inf_code] = np.inf
        return np.where(codes >> (self.bits - 1) == 1, -value, value)

    def encode(self, x: np.ndarray, rtz: bool, saturate: bool) -> np.ndarray:
        """Codes of float64 ``x`` rounded to this format: to nearest, ties to even code (the even
        mantissa), or toward zero (``rtz``). Overflow: +-max if ``saturate`` (or ``rtz``), else +-Inf,
        or NaN without Inf. NaN becomes ``nan_code``."""
        finite = self.values[: self.max_code + 1]
        beyond = 2 * finite[-1] - finite[-2]        # one ulp past the largest finite value
        magnitude = np.abs(x)
        low = np.searchsorted(finite, magnitude, side="right") - 1
        if rtz:
            code = low
        else:
            high_value = np.append(finite[1:], beyond)[low]
            middle = (finite[low] + high_value) / 2
            code = low + ((magnitude > middle) | ((magnitude == middle) & (low % 2 == 1)))
        infinite = np.isinf(magnitude)
        code = np.where(infinite, self.max_code + 1, code)
        overflow = code > self.max_code
        to_max = overflow & (saturate | (rtz & ~infinite))
        overflow_code = self.inf_code if self.inf_code is not None else self.nan_code
        code = np.where(to_max, self.max_code, np.where(overflow, overflow_code, code))
        code = code | (np.signbit(x).astype(np.int64) << (self.bits - 1))
        return np.where(np.isnan(x), self.nan_code, code)


_FORMATS = {
    "bf16": _Format(16, 7, 127, 0x7F7F, 0x7F80, 0x7FFF, np.uint16),
    "fp16": _Format(16, 10, 15, 0x7BFF, 0x7C00, 0x7FFF, np.float16),
    "fp8e4nv": _Format(8, 3, 7, 0x7E, None, 0x7F, np.uint8),
    "fp8e5": _Format(8, 2, 15, 0x7B, 0x7C, 0x7F, np.uint8),
}
_HANDLED = ("fp32", "fp64", *_FORMATS)


def _values(data: np.ndarray, dtype) -> np.ndarray:
    """Exact float64 values of interpreter storage ``data`` of triton scalar type ``dtype``."""
    fmt = _FORMATS.get(dtype.name)
    if fmt is None:
        return np.asarray(data).astype(np.float64)
    return fmt.values[np.asarray(data).view(f"uint{fmt.bits}")]


def _round(x: np.ndarray, dtype, rtz: bool, saturate: bool) -> np.ndarray:
    """Interpreter storage of float64 ``x`` rounded once to triton scalar type ``dtype``."""
    fmt = _FORMATS.get(dtype.name)
    if fmt is not None:
        return fmt.encode(x, rtz, saturate).astype(f"uint{fmt.bits}").view(fmt.storage)
    if dtype.name == "fp64":
        return x.astype(np.float64)
    rounded = x.astype(np.float32)                 # numpy rounds to nearest even
    if rtz:
        rounded = np.where(np.abs(rounded) > np.abs(x), np.nextafter(rounded, np.float32(0)), rounded)
    return rounded


# ---------------------------------------------------------------------------------------------
# tl.dot
# ---------------------------------------------------------------------------------------------

def _tf32_truncate(x: np.ndarray) -> np.ndarray:
    """fp32 -> tf32 as the tensor core reads it: the low 13 mantissa bits dropped (Inf/NaN kept)."""
    bits = x.view(np.uint32)
    special = (bits & np.uint32(0x7F800000)) == np.uint32(0x7F800000)
    return np.where(special, bits, bits & np.uint32(0xFFFFE000)).view(np.float32)


def _tf32_round_away(x: np.ndarray) -> np.ndarray:
    """``cvt.rna.tf32.f32``: nearest tf32, ties away from zero (on the magnitude bits)."""
    bits = x.view(np.uint32)
    special = (bits & np.uint32(0x7F800000)) == np.uint32(0x7F800000)
    return np.where(special, bits, (bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def _fma_dot(a: np.ndarray, b: np.ndarray, acc: np.ndarray) -> np.ndarray:
    """``acc + a @ b`` as fused multiply-adds in float32, k = 0, 1, ... in order: what the GPU runs
    for an fp32 "ieee" dot (FMA instructions; measured bitwise equal on an H200).

    a [..., M, K], b [..., K, N], acc [..., M, N], all float32. Each step forms ``acc + a*b`` in
    float64 (the product is exact), rounds it to odd (TwoSum gives the exact error, an inexact
    result with an even last bit moves one ulp toward it) and then to float32: with 53 >= 2*24 + 2
    bits that is the correctly rounded FMA (Boldo & Melquiond, "Emulation of FMA and correctly
    rounded sums: proved algorithms using rounding to odd", IEEE TC 2008)."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    for k in range(a.shape[-1]):
        c = acc.astype(np.float64)
        product = a64[..., :, k:k + 1] * b64[..., k:k + 1, :]
        total = c + product
        part = total - c
        error = (c - (total - part)) + (product - part)
        bits = total.view(np.int64)
        inexact_even = (error != 0) & (bits & 1 == 0) & np.isfinite(total)
        bits = bits + np.where(inexact_even, np.where((error > 0) == (total > 0), 1, -1), 0)
        acc = bits.view(np.float64).astype(np.float32)
    return acc


_MIN_EXPONENT = {"tf32": -126, "bf16": -126, "fp16": -14, "fp8e4nv": -6, "fp8e5": -14}


def _exponent(x: np.ndarray, minimum: int) -> np.ndarray:
    """Exponent field of ``x`` as hardware reads it: floor(log2|x|), ``minimum`` for subnormals."""
    return np.maximum(np.frexp(x)[1] - 1, minimum).astype(np.int32)


def _truncate(x: np.ndarray, bits: int) -> np.ndarray:
    """``x`` (float64) rounded toward zero to ``bits`` mantissa bits, exponent range of float32."""
    step = np.maximum(np.frexp(x)[1] - 1 - bits, -126 - bits).astype(np.int32)
    return np.ldexp(np.trunc(np.ldexp(x, -step)), step)


def _mma(a: np.ndarray, b: np.ndarray, acc: np.ndarray, formats: tuple) -> np.ndarray:
    """``acc + a @ b`` as the Hopper tensor core computes it, fitted bit for bit on an H200.

    a [..., M, K], b [..., K, N]: exact operand values of ``formats`` (tf32, bf16, fp16, fp8e4nv,
    fp8e5), acc [..., M, N] float32 or float16. One instruction takes ``step`` k at a time (8 tf32,
    16 bf16/fp16, 32 fp8): the products are exact; each product and the accumulator is truncated
    (toward zero) to ``align`` bits below the largest exponent among them (a product's exponent is the
    sum of its operands' exponent fields); the truncated terms are added exactly and the sum is
    truncated to ``bits`` mantissa bits (float16 accumulators: rounded to nearest float16 instead).
    Non-finite terms give their IEEE sum. align/bits: 25/23, and 13/13 for fp8 through wgmma
    (M >= 64): Triton's default max_num_imprecise_acc on sm_90 keeps fp8 sums inside the tensor
    core, whose accumulator has 13 mantissa bits. fp8 with M < 64 (mma.sync) is approximated by
    25/23: 89-90% of outputs bitwise equal on random inputs, errors of the same size."""
    fp8 = formats[0].startswith("fp8")
    step = {"tf32": 8, "bf16": 16, "fp16": 16}.get(formats[0], 32)
    align, bits = (13, 13) if fp8 and a.shape[-2] >= 64 else (25, 23)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    # a zero operand's exponent field far below any other, so that its products never set the largest exponent
    ea, eb = (np.where(x != 0, _exponent(x, _MIN_EXPONENT[f]), -(1 << 20)) for x, f in zip((a64, b64), formats))
    finite_operands = bool(np.isfinite(a64).all() and np.isfinite(b64).all())   # then every product is finite
    out = acc.dtype
    acc = acc.astype(np.float64)
    for k0 in range(0, a.shape[-1], step):
        ks = slice(k0, k0 + step)
        products = a64[..., :, None, ks] * np.swapaxes(b64[..., ks, :], -1, -2)[..., None, :, :]
        exponents = ea[..., :, None, ks] + np.swapaxes(eb[..., ks, :], -1, -2)[..., None, :, :]
        top = np.where(acc != 0, _exponent(acc, -126), -(1 << 20))
        top = np.maximum(exponents.max(-1), top) - align
        # scaled by powers of two, as ldexp would (exact: a nonzero term's exponent field is at least -252 and top
        # at most 254, so the scaled terms stay far inside float64's normal range); where every term is zero,
        # top is clamped so that the powers stay finite
        top = np.maximum(top, -1000)
        down = np.ldexp(1.0, -top)
        total = np.trunc(products * down[..., None]).sum(-1) + np.trunc(acc * down)
        exact = total * np.ldexp(1.0, top)
        result = _truncate(exact, bits) if out == np.float32 else exact   # float16: rounded below
        finite = np.isfinite(acc) if finite_operands else np.isfinite(products).all(-1) & np.isfinite(acc)
        if not finite.all():
            result = np.where(finite, result, products.sum(-1) + acc)
        acc = result.astype(out).astype(np.float64)
    return acc.astype(out)


def _dot_fp32(a: np.ndarray, b: np.ndarray, acc: np.ndarray, precision: str) -> np.ndarray:
    """``tl.dot`` of float32 operands with ``input_precision`` "ieee", "tf32" or "tf32x3"."""
    if precision == "ieee":
        return _fma_dot(a, b, acc)
    tf32 = ("tf32", "tf32")
    if precision == "tf32":
        return _mma(_tf32_truncate(a), _tf32_truncate(b), acc, tf32)
    a_hi, b_hi = _tf32_round_away(a), _tf32_round_away(b)
    a_lo, b_lo = _tf32_truncate(a - a_hi), _tf32_truncate(b - b_hi)
    small = _mma(a_lo, b_hi, np.zeros_like(acc), tf32)
    small = _mma(a_hi, b_lo, small, tf32)
    small = np.where(np.isnan(small), np.float32(0), small)
    return _mma(a_hi, b_hi, small, tf32) + acc


def _bf16_parts(x: np.ndarray, n: int) -> list[np.ndarray]:
    """Triton's splitF32 (F32DotTC.cpp): ``hi = bf16(x)`` (arith.truncf: nearest even),
    ``mid = bf16(x - hi)``, ``lo = bf16(x - hi - mid)``, the differences in float32; the first
    ``n`` parts as exact values (float32)."""
    fmt = _FORMATS["bf16"]
    parts = []
    with np.errstate(all="ignore"):
        for _ in range(n):
            part = fmt.values[fmt.encode(x.astype(np.float64), rtz=False, saturate=False)].astype(np.float32)
            parts.append(part)
            x = x - part
    return parts


def _dot_bf16xn(a: np.ndarray, b: np.ndarray, acc: np.ndarray, precision: str) -> np.ndarray:
    """``tl.dot`` of float32 operands with ``input_precision`` "bf16x3" or "bf16x6": Triton's BF16xN
    pattern (F32DotTC.cpp) splits each operand into bf16 parts (``_bf16_parts``) and chains bf16
    tensor-core dots from a zero accumulator, smallest terms first: bf16x6 mid*mid, lo*hi, hi*lo,
    then (both) mid*hi, hi*mid; NaN replaced by 0; hi*hi; the result added to ``acc`` in float32."""
    bf16 = ("bf16", "bf16")
    a_parts, b_parts = _bf16_parts(a, 3), _bf16_parts(b, 3)
    order = [(1, 0), (0, 1)]
    if precision == "bf16x6":
        order = [(1, 1), (2, 0), (0, 2)] + order
    result = np.zeros_like(acc)
    for i, j in order:
        result = _mma(a_parts[i], b_parts[j], result, bf16)
    result = np.where(np.isnan(result), np.float32(0), result)
    return _mma(a_parts[0], b_parts[0], result, bf16) + acc


# ---------------------------------------------------------------------------------------------
# The patches (methods of triton.runtime.interpreter.InterpreterBuilder and Autotuner)
# ---------------------------------------------------------------------------------------------

class IllegalMemoryAccess(RuntimeError):
    """An interpreted kernel loaded or stored outside every tensor argument's storage."""


_ARGUMENT_SPANS: list[tuple[np.ndarray, np.ndarray, list[str]]] = []
"""The launch in progress: starts and ends (sorted, in bytes) of its tensor arguments' storages, and
their names."""


def _init_args_hst(self, args_dev, kwargs):
    # GPU: a kernel may touch only memory it was given. Stock: no record of what it was given.
    args_hst, kwargs_hst = _stock("_init_args_hst")(self, args_dev, kwargs)
    names = inspect.getfullargspec(self.fn).args
    spans = {}

    def note(name, arg):
        if isinstance(arg, tuple):
            for item in arg:
                note(name, item)
        elif hasattr(arg, "base") and hasattr(arg.base, "untyped_storage"):      # a TensorDescriptor
            note(name, arg.base)
        elif hasattr(arg, "untyped_storage"):
            storage = arg.untyped_storage()
            start = storage.data_ptr()
            spans[start] = (start + storage.nbytes(), spans.get(start, (0, name))[1])

    for name, arg in [*zip(names, args_hst), *kwargs_hst.items()]:
        note(name, arg)
    starts = sorted(spans)
    _ARGUMENT_SPANS[:] = [(np.array(starts, dtype=np.uint64), np.array([spans[s][0] for s in starts], dtype=np.uint64),
                           [spans[s][1] for s in starts])]
    return args_hst, kwargs_hst


def _check_access(what: str, ptrs, mask) -> None:
    """Raise ``IllegalMemoryAccess`` if an active lane of ``ptrs`` leaves every argument's storage."""
    if not _ARGUMENT_SPANS:
        return
    starts, ends, names = _ARGUMENT_SPANS[0]
    active = np.broadcast_to(np.asarray(mask.data, dtype=bool), ptrs.data.shape)
    addresses = ptrs.data[active].astype(np.uint64)
    if addresses.size == 0:
        return
    size = np.uint64(max(1, ptrs.get_element_ty().primitive_bitwidth // 8))
    which = np.searchsorted(starts, addresses, side="right") - 1
    inside = (which >= 0) & (addresses + size <= ends[np.maximum(which, 0)])
    if inside.all():
        return
    bad = int(addresses[~inside][0])
    nearest = int(np.argmin([min(abs(bad - int(a)), abs(bad - int(b))) for a, b in zip(starts, ends)]))
    place = (f"{bad - int(ends[nearest])} bytes past the end of" if bad >= int(ends[nearest])
             else f"{int(starts[nearest]) - bad} bytes before")
    raise IllegalMemoryAccess(f"illegal memory access: a {what} of {int((~inside).sum())} of {addresses.size} active "
                              f"lanes outside every tensor argument, the first {place} argument "
                              f"'{names[nearest]}' ({int(ends[nearest] - starts[nearest])} bytes)")


def _create_masked_load(self, ptrs, mask, other, cache_policy, is_volatile):
    _check_access("load", ptrs, mask)
    return _stock("create_masked_load")(self, ptrs, mask, other, cache_policy, is_volatile)


def _create_masked_store(self, ptrs, value, mask, cache_policy):
    _check_access("store", ptrs, mask)
    return _stock("create_masked_store")(self, ptrs, value, mask, cache_policy)


def _launch(self, *args_dev, **kwargs):
    # Speed, not semantics (CPython 3.11+): frames live on per-thread data-stack chunks of 16 KB, and a
    # chunk is unmapped the moment the frame at its base returns, so an interpreted kernel whose calls go
    # up and down across a chunk boundary maps and unmaps memory at every crossing: 1.8 million page
    # faults, 13 s of system time in a 22 s GLA law test. A launch runs inside one frame of ~1 MB of
    # local slots, which starts a 2 MB chunk; the kernel's calls fit in the ~0.9 MB left of it.
    global _BIG_FRAME
    if _BIG_FRAME is None:
        names = " = ".join(f"v{i}" for i in range(_BIG_FRAME_SLOTS))
        scope: dict[str, Any] = {}
        exec(compile(f"def big_frame(_f, *args, **kwargs):\n    if _f is None:\n        {names} = None\n"
                     "    return _f(*args, **kwargs)\n", "<refcheck big frame>", "exec"), scope)
        _BIG_FRAME = scope["big_frame"]
    return _BIG_FRAME(_stock("__call__"), self, *args_dev, **kwargs)


_BIG_FRAME_SLOTS = 140_000
"""Local slots of the frame every interpreted launch runs in: 1.1 MB, so a 2 MB data-stack chunk."""
_BIG_FRAME: Any = None


def _stock(name: str):
    """The original of a patched method."""
    return _STOCK_BY_NAME[name]


def _get_np_dtype(tt_dtype):
    # Speed, not semantics: stock builds its table of nineteen dtypes (hashing each) on every call, and it is called
    # for most interpreted operations (the numpy dtype of a tensor being made, cast or splat): about 5% of an
    # interpreted KDA forward and backward (bf16, B=2, T=130, H=2, K=V=32, CPU seconds over four runs each: 3.85-3.98
    # stock, 3.49-4.18 here, medians 3.94 and 3.77). Each scalar dtype's answer is stock's, kept.
    import triton.language as tl
    scalar = tt_dtype.element_ty if isinstance(tt_dtype, tl.block_type) else tt_dtype
    if isinstance(scalar, tl.pointer_type):   # pointer types are not hashable; stock's answer for every one
        return _stock("_get_np_dtype")(tt_dtype)
    found = _NP_DTYPES.get(scalar)
    if found is None:
        found = _NP_DTYPES[scalar] = _stock("_get_np_dtype")(scalar)
    return found


_NP_DTYPES: dict[Any, np.dtype] = {}
"""``_get_np_dtype``'s answers by scalar triton dtype."""


def _create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
    # GPU (sm_90): fp32 "ieee" is an FMA loop over k, everything else runs on the tensor core (_mma;
    # tf32x3 split by Triton's F32DotTC pass): bitwise equal on an H200 and an H100, see
    # benchmarks/interpreter_calibration_h200.json. Stock: np.matmul of the stored values, so bf16
    # bit patterns are multiplied as integers, and input_precision is ignored.
    names = (a.dtype.name, b.dtype.name)
    if not all(n in _HANDLED and n != "fp64" for n in names) or d.dtype.name not in ("fp32", "fp16"):
        return _stock("create_dot")(self, a, b, d, input_precision, max_num_imprecise_acc)
    a32 = _values(a.data, a.dtype).astype(np.float32)
    b32 = _values(b.data, b.dtype).astype(np.float32)
    acc = np.array(d.data, copy=True)
    with np.errstate(all="ignore"):
        precision = input_precision.name.lower()
        if names == ("fp32", "fp32") and precision.startswith("bf16x"):
            result = _dot_bf16xn(a32, b32, acc, precision)
        elif names == ("fp32", "fp32"):
            result = _dot_fp32(a32, b32, acc, precision)
        else:
            result = _mma(a32, b32, acc, names)
    return type(d)(result, d.dtype.scalar)


def _cast_impl(self, src, dst_type):
    # GPU: arith.truncf/extf/sitofp/fptosi lower to cvt.rn (round to nearest even) on values; fp32 ->
    # bf16/fp16 measured bitwise equal on an H200 (cast probes). Stock: fp32->bf16 truncates, and
    # fp64<->bf16 and int<->bf16/fp8 take the stored bit patterns for numbers.
    stock = _stock("cast_impl")
    s, d = src.dtype.scalar, dst_type.scalar
    if s.name not in _HANDLED and d.name not in _HANDLED:
        return stock(self, src, dst_type)
    with np.errstate(all="ignore"):
        if s.is_floating() and d.is_floating() and s.name in _HANDLED and d.name in _HANDLED:
            return type(src)(_round(_values(src.data, s), d, rtz=False, saturate=False), d)
        if s.name in _FORMATS and d.is_int():
            return stock(self, type(src)(_values(src.data, s), _float64()), dst_type)
        if s.is_int() and d.name in _FORMATS:
            return type(src)(_round(src.data.astype(np.float64), d, rtz=False, saturate=False), d)
    return stock(self, src, dst_type)


def _float64():
    import triton.language as tl

    return tl.float64


def _create_fp_to_fp(self, src, dst_type, rounding_mode):
    # GPU (sm_90, ElementwiseOpToLLVM.cpp): fp32/fp16/bf16 -> fp8 is cvt.rn.satfinite (nearest even,
    # saturating; measured bitwise equal on an H200, specials included), fp8 -> wider is exact, rtz
    # truncates. Stock: rounds half up without ties-to-even or carry into the exponent, does not
    # saturate, and decodes the e4m3 NaN as a number.
    s, d = src.dtype.scalar, dst_type.scalar
    if s.name not in _HANDLED or d.name not in _HANDLED:
        return _stock("create_fp_to_fp")(self, src, dst_type, rounding_mode)
    rtz = rounding_mode is not None and rounding_mode.name == "RTZ"
    with np.errstate(all="ignore"):
        data = _round(_values(src.data, s), d, rtz=rtz, saturate=d.name in _FP8 and not rtz)
    return type(src)(data, d)


def _prune_configs(self, kwargs):
    # GPU: benchmarks the pruned configs and caches the fastest per key. Interpreted there is no
    # driver to benchmark with, so keep one config (the pinned one, else the first left after
    # pruning); Autotuner.run then caches it without benchmarking.
    stock = _stock("prune_configs")
    if not is_interpreted(self):
        return stock(self, kwargs)
    pinned = _PINNED.get(self)
    return [pinned] if pinned is not None else stock(self, kwargs)[:1]


# ---------------------------------------------------------------------------------------------
# bf16 arithmetic (InterpreterBuilder.binary_op/unary_op/create_fma, ReduceOps, ScanOps)
# ---------------------------------------------------------------------------------------------

def _is_bf16(handle) -> bool:
    return handle.dtype.scalar.name == "bf16"


def _bf16_storage(x: np.ndarray) -> np.ndarray:
    """Interpreter storage (uint16 codes) of float64 ``x`` rounded to nearest even bf16."""
    return _FORMATS["bf16"].encode(np.asarray(x, dtype=np.float64), rtz=False, saturate=False).astype(np.uint16)


def _binary_op(self, lhs, rhs, op):
    # GPU (sm_90): bf16 add/sub/mul (add.rn.bf16, ...; others through float32) round the exact
    # result of the values to nearest even bf16, min/max/compares compare values. Computing in
    # float64 and rounding once gives the same bf16 (53 >= 2*8 + 2 bits: double rounding is
    # innocuous for +, -, *, /; Figueroa 1995). Stock: numpy operates on the uint16 codes (bf16 is
    # stored as its bit pattern), so 1.0 + 1.0 is the sum of two integers.
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle, _get_np_dtype, _validate_np_data_size

    if op in _COMPARISONS:
        # GPU: a comparison is an i1 whatever its operands. Stock: its handle keeps the operands'
        # type (bool data typed int32, or floats 0/1), and splatting that to a block makes int32
        # data, so `tl.load(..., mask=block_mask & (n % 2 == 1))` fails "mask has unsupported dtype".
        return TensorHandle(op(_compared(lhs), _compared(rhs)), tl.int1)
    if not (_is_bf16(lhs) or _is_bf16(rhs)):
        return _stock("binary_op")(self, lhs, rhs, op)
    with np.errstate(all="ignore"):
        output = op(_values(lhs.data, lhs.dtype.scalar), _values(rhs.data, rhs.dtype.scalar))
    tl_dtype = lhs.dtype.scalar
    if output.dtype == np.float64 and tl_dtype.name == "bf16":
        return TensorHandle(_bf16_storage(output), tl_dtype)
    if not _validate_np_data_size(output, tl_dtype):     # a comparison: as stock does with its result
        output = output.astype(_get_np_dtype(tl_dtype))
    return TensorHandle(output, tl_dtype)


_COMPARISONS = (np.equal, np.not_equal, np.less, np.less_equal, np.greater, np.greater_equal)
"""The numpy functions the stock builder compares with (``create_icmp*``, ``create_fcmp*``)."""


def _compared(handle) -> np.ndarray:
    """What a comparison compares: the values of bf16/fp8 storage (uint codes), other data as it is."""
    return _values(handle.data, handle.dtype.scalar) if handle.dtype.scalar.name in _FORMATS else handle.data


def _unary_op(self, arg, op):
    # GPU (sm_90): bf16 math functions are computed in float32 and rounded to bf16 (Triton's
    # ElementwiseOpToLLVM upcasts them); negation flips the sign. Stock: numpy on the uint16 codes.
    from triton.runtime.interpreter import TensorHandle

    if not _is_bf16(arg):
        return _stock("unary_op")(self, arg, op)
    with np.errstate(all="ignore"):
        output = op(_values(arg.data, arg.dtype.scalar).astype(np.float32))
    return TensorHandle(_bf16_storage(output), arg.dtype.scalar)


def _flushed(x: np.ndarray) -> np.ndarray:
    """fp32 ``x`` with its subnormals flushed to a zero of their sign."""
    return np.where(np.abs(x) < np.finfo(np.float32).smallest_normal, np.copysign(np.float32(0), x), x)


def _create_exp2(self, arg):
    # GPU (sm_90, triton 3.6): fp32 tl.exp2 flushes a subnormal result to zero (exp2(-130) = 0; the
    # ``math_specials/exp2`` probe, H200). Stock: numpy's exact subnormal.
    out = self.unary_op(arg, np.exp2)
    if arg.dtype.scalar.name == "fp32":
        out.data = _flushed(out.data)
    return out


def _create_sqrt(self, arg):
    # GPU (sm_90, triton 3.6): fp32 tl.sqrt flushes a subnormal input to zero first (sqrt(2^-130) = 0;
    # ``math_specials/sqrt``, H200); tl.sqrt_rn is another builder method. Stock: numpy's exact root.
    if arg.dtype.scalar.name == "fp32":
        from triton.runtime.interpreter import TensorHandle
        arg = TensorHandle(_flushed(arg.data), arg.dtype.scalar)
    return self.unary_op(arg, np.sqrt)


def _create_fma(self, x, y, z):
    # GPU (sm_90): fma.rn.bf16, the exact x*y + z rounded once. The float64 product of two bf16 is
    # exact, the float64 sum rounds once more, innocuously (see _binary_op). Stock: the uint16 codes.
    from triton.runtime.interpreter import TensorHandle

    if not _is_bf16(z):
        return _stock("create_fma")(self, x, y, z)
    with np.errstate(all="ignore"):
        output = _values(x.data, x.dtype.scalar) * _values(y.data, y.dtype.scalar) + _values(z.data, z.dtype.scalar)
    return TensorHandle(_bf16_storage(output), z.dtype.scalar)


def _tree_sum_bf16(values: np.ndarray, axis: int) -> np.ndarray:
    """Sum float64 bf16 ``values`` along ``axis`` pairwise (neighbours, then neighbours of those,
    ...), every addition rounded to bf16; returns float64 values."""
    x = np.moveaxis(values, axis, 0)
    while x.shape[0] > 1:
        if x.shape[0] % 2:
            x = np.concatenate([x, np.zeros_like(x[:1])])
        x = _FORMATS["bf16"].values[_bf16_storage(x[0::2] + x[1::2])]
    return x[0] if x.shape[0] else np.zeros(x.shape[1:])


def _reduce_sum(self, input):
    # GPU: a bf16 tl.sum (triton.language.standard.sum keeps the input dtype unless told
    # otherwise) adds in bf16, each addition rounded: sequentially within a thread, then a
    # butterfly across lanes and warps, an order that depends on the layout. Here a pairwise tree
    # along the axis, each addition rounded to bf16: the GPU's rounding per addition, not its exact
    # order (not bitwise). Stock: np.sum of the uint16 codes.
    if not _is_bf16(input.handle):
        return _stock("sum")(self, input)
    axis = self.axis
    data = _values(input.handle.data, input.dtype)
    if axis is None:
        data, axis = data.reshape(-1), 0
    total = _tree_sum_bf16(data, axis)
    if self.keep_dims:
        total = np.expand_dims(total, axis) if self.axis is not None else total.reshape((1,) * input.handle.data.ndim)
    codes = _bf16_storage(total).view(np.uint16)
    return self.to_tensor(codes if codes.shape else codes.item(), input.dtype)


def _reduce_min_max(self, input, val_reduce_op, idx_reduce_op=None):
    # GPU: bf16 max/min/argmax/argmin compare values. Stock: compares the uint16 codes (negative
    # values sort above positive ones). Here the values are reduced and the result stored as bf16.
    import triton.language as tl

    input = input[0] if isinstance(input, tuple) else input
    if not _is_bf16(input.handle):
        return _stock("min_max")(self, input, val_reduce_op, idx_reduce_op)
    data = _values(input.handle.data, input.dtype)
    val = idx = None
    if val_reduce_op:
        val = _bf16_storage(val_reduce_op(data, axis=self.axis, keepdims=self.keep_dims))
        val = self.to_tensor(val if val.shape else val.item(), input.dtype)
    if idx_reduce_op:
        idx = self.to_tensor(idx_reduce_op(data, axis=self.axis, keepdims=self.keep_dims), tl.int32)
    if val is not None and idx is not None:
        return val, idx
    return val if val is not None else idx


def _scan_cumsum(self, input):
    # GPU: a bf16 tl.cumsum adds in bf16, each addition rounded (a scan across lanes, sequential
    # within a thread). Here sequentially along the axis, each addition rounded to bf16 (not
    # bitwise). Stock: np.cumsum of the uint16 codes.
    if not _is_bf16(input.handle):
        return _stock("cumsum")(self, input)
    data = np.moveaxis(_values(input.handle.data, input.dtype), self.axis, 0)
    out = np.empty_like(data)
    running = np.zeros(data.shape[1:])
    for i in range(data.shape[0]):
        running = _FORMATS["bf16"].values[_bf16_storage(running + data[i])] if i else data[0]
        out[i] = running
    return [self.to_tensor(_bf16_storage(np.moveaxis(out, 0, self.axis)), dtype=input.dtype)]


def _implicit_cvt(arg):
    # Compiler (jit.mangle_type): a Python float kernel argument is an fp32 scalar tensor, so
    # `x * scale` with a bf16 `x` promotes to fp32. Stock: the float stays a Python number, a
    # literal to Triton's promotion rules, and `x * scale` is computed in bf16.
    if isinstance(arg, float):
        import triton.language as tl
        from triton.runtime.interpreter import TensorHandle

        return tl.tensor(TensorHandle(np.array([arg], dtype=np.float32), tl.float32), tl.float32)
    return _stock("_implicit_cvt")(arg)


# ---------------------------------------------------------------------------------------------
# Loop indices (triton.runtime.interpreter._patch_lang and FunctionRewriter._transform_ast)
# ---------------------------------------------------------------------------------------------

_LOOP_HELPER = "_refcheck_loop_range"


def _loop_range(start, end=None, step=None, **kwargs):
    """The induction variable of ``for i in range(...)`` / ``tl.range(...)`` as the compiler makes it
    (code_generator.visit_For): bounds and step to tensors (a Python int: int32, else int64 ...),
    the index a scalar tensor of their promoted integer type. ``tl.range``'s keyword hints
    (num_stages, ...) only steer the compiler's pipelining."""
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle
    from triton.runtime.interpreter import interpreter_semantic as semantic

    if end is None:
        start, end = 0, start
    bounds = [semantic.to_tensor(x) for x in (start, end, 1 if step is None else step)]
    if not all(b.dtype.is_int() for b in bounds):
        raise TypeError(f"For loop bounds and step must all be ints, are {tuple(str(b.dtype) for b in bounds)}")
    iv_type = semantic.integer_promote_impl(semantic.integer_promote_impl(bounds[0].dtype, bounds[1].dtype),
                                            bounds[2].dtype)
    storage = np.dtype(iv_type.name.replace("u", "uint") if iv_type.name.startswith("u") else iv_type.name)
    lo, hi, by = (int(b.handle.data.reshape(-1)[0]) for b in bounds)
    for i in range(lo, hi, by):
        yield tl.tensor(TensorHandle(np.array([i], dtype=storage), iv_type), iv_type)


def _loop_iterator(iterator, *args, **kwargs):
    """What ``for`` iterates over in an interpreted kernel: Python's ``range`` as the compiler
    treats it (a tensor index); anything else (``tl.range``, ``tl.static_range``) as patched."""
    import builtins
    return _loop_range(*args, **kwargs) if iterator is builtins.range else iterator(*args, **kwargs)


def _loop_transformer():
    import ast

    class LoopIndices(ast.NodeTransformer):
        """``for i in F(args)`` -> ``for i in _refcheck_loop_range(F, args)``."""

        def visit_For(self, node):
            node = self.generic_visit(node)
            call = node.iter
            if isinstance(call, ast.Call):
                node.iter = ast.copy_location(ast.Call(func=ast.Name(id=_LOOP_HELPER, ctx=ast.Load()),
                                                       args=[call.func, *call.args], keywords=call.keywords), call)
            return node

    return LoopIndices()


def _transform_ast(self, src):
    # Compiler (code_generator.visit_For): the index of a `range` or `tl.range` loop is a scalar
    # tensor of the bounds' promoted integer type (int32 for Python ints that fit), so kernels call
    # `.to(tl.int64)` on it and its arithmetic wraps in int32; only `tl.static_range` gives Python
    # ints (constexpr). Stock: every loop index is a Python int (`tl.range` is Python's range), so
    # FLA's `i_t.to(tl.int64)` raises AttributeError. Here every `for` over a call is routed
    # through _loop_iterator, and `tl.range` yields tensors (_patch_lang).
    import ast
    tree = _stock("_transform_ast")(self, src)
    self.fn.__globals__[_LOOP_HELPER] = _loop_iterator
    return ast.fix_missing_locations(_loop_transformer().visit(tree))


def _patch_lang(fn):
    # Loop indices: see _transform_ast. Stock maps tl.range and tl.static_range to Python's range;
    # tl.range is the compiler's tensor-index loop, so it gets _loop_range (static_range keeps ints).
    # Builtins under other names: the compiler (code_generator.visit_Call) calls any global that
    # is a triton builtin as one, whatever its name (FLA's `gather = tl.gather`); stock patches
    # only the attributes of tl, tl.core, tl.math and tl.tensor, so an alias in the kernel's module
    # raises "Did you forget to add @triton.jit ?". Here the kernel module's aliases are patched too.
    #
    # Speed: stock patches tl again on every call of a @triton.jit helper (inspect.getmembers over tl,
    # tl.core, tl.math and tl.tensor: half the time of an interpreted GLA law run), though the kernel's
    # launch patched them already and restores them when it ends. A call made while they are patched
    # patches only its own module's aliases.
    import triton.language as tl
    from triton.runtime import interpreter as stock

    module = sys.modules.get(fn.__module__)
    own = module is not None and module.__dict__ is fn.__globals__   # a module's function (else exec'd globals)
    if own:
        if module.__name__ not in _ALIASES:
            _ALIASES[module.__name__] = _aliases(vars(module))
        aliases = _ALIASES[module.__name__]
    else:
        aliases = _aliases(fn.__globals__)
    if aliases.langs and all(not tl.core.is_builtin(lang.__dict__.get("arange")) for lang in aliases.langs):
        scope = stock._LangPatchScope()
    else:
        scope = _stock("_patch_lang")(fn)
    for lang in (tl, tl.core):
        if lang.__dict__.get("range") is lang.__dict__.get("static_range"):   # the ones stock patched
            scope.set_attr(lang, "range", _loop_range)
    if own:
        for name in aliases.builtins:
            value = module.__dict__.get(name)
            if tl.core.is_builtin(value):
                stock._patch_attr(module, name, value, stock.interpreter_builder, scope)
    for value in aliases.libdevice:
        for name, op in LIBDEVICE.items():
            if value.__dict__.get(name) is not None and getattr(value.__dict__[name], "__wrapped__", None) is None:
                scope.set_attr(value, name, _libdevice(name, op))
    return scope


def _aliases(scope: dict) -> _Aliases:
    """What ``_patch_lang`` patches in a kernel's globals ``scope``."""
    import triton.language as tl
    values = list(scope.values())
    modules = _libdevice_modules()
    return _Aliases(langs=tuple(v for v in values if v is tl or v is tl.core),
                    builtins=tuple(n for n, v in scope.items() if tl.core.is_builtin(v)),
                    libdevice=tuple(v for v in values if any(v is m for m in modules)))


LIBDEVICE = {"tanh": np.tanh}
"""The libdevice functions (``triton.language.extra.libdevice``) the interpreter computes, by numpy in the
argument's dtype (fp32 or fp64, as libdevice takes them)."""


def _libdevice_modules() -> tuple:
    import triton.language.extra.cuda.libdevice as cuda
    import triton.language.extra.libdevice as generic
    return generic, cuda


def _libdevice(name: str, op):
    """``libdevice.<name>`` for the interpreter: ``op`` on the values of an fp32 or fp64 tensor. On the GPU
    (sm_90) ``__nv_tanhf`` is within 2 ulp of the exact tanh; numpy's float32 tanh within 1 or 2 (not
    bitwise the same)."""
    import triton.language as tl
    from triton.runtime import interpreter as stock

    def function(arg0, _semantic=None):
        if not isinstance(arg0, tl.tensor) or arg0.dtype.scalar.name not in ("fp32", "fp64"):
            raise ValueError(f"libdevice.{name}: expected an fp32 or fp64 tensor, got {arg0!r}")
        with np.errstate(all="ignore"):
            data = op(arg0.handle.data)
        return tl.tensor(stock.TensorHandle(data.astype(arg0.handle.data.dtype), arg0.dtype.scalar), arg0.type)
    function.__wrapped__ = op  # type: ignore[attr-defined]
    return function


class _Aliases(NamedTuple):
    langs: tuple                # triton.language and triton.language.core, where the module imported them
    builtins: tuple[str, ...]   # the names that hold a triton builtin (aliases such as ``gather = tl.gather``)
    libdevice: tuple            # the libdevice modules it imported (``libdevice.tanh`` patched on each call)


_ALIASES: dict[str, _Aliases] = {}
"""What ``_patch_lang`` patches in each kernel module, found on its first call (the scans of the module's globals on
every call of a ``@triton.jit`` helper took a fifth of an interpreted GDN forward and backward)."""


_SIGNATURES = {
    "_get_np_dtype": ["tt_dtype"],
    "create_dot": ["self", "a", "b", "d", "input_precision", "max_num_imprecise_acc"],
    "cast_impl": ["self", "src", "dst_type"],
    "create_fp_to_fp": ["self", "src", "dst_type", "rounding_mode"],
    "prune_configs": ["self", "kwargs"],
    "_transform_ast": ["self", "src"],
    "binary_op": ["self", "lhs", "rhs", "op"],
    "unary_op": ["self", "arg", "op"],
    "create_fma": ["self", "x", "y", "z"],
    "create_exp2": ["self", "arg"],
    "create_sqrt": ["self", "arg"],
    "sum": ["self", "input"],
    "min_max": ["self", "input", "val_reduce_op", "idx_reduce_op"],
    "cumsum": ["self", "input"],
    "_patch_lang": ["fn"],
    "_implicit_cvt": ["arg"],
    "create_masked_load": ["self", "ptrs", "mask", "other", "cache_policy", "is_volatile"],
    "create_masked_store": ["self", "ptrs", "value", "mask", "cache_policy"],
    "_init_args_hst": ["self", "args_dev", "kwargs"],
    "__call__": ["self", "args_dev", "kwargs"],
}


def _patch_table(stock, autotuner) -> list:
    """(owner, name, replacement) for each patch, after checking the version and the internals."""
    import triton

    version = triton.__version__
    if not version.startswith(SUPPORTED_VERSIONS):
        raise UnsupportedTritonError(
            f"refcheck.runtime.interpreter was checked against triton {', '.join(v + 'x' for v in SUPPORTED_VERSIONS)}, "
            f"found {version}: its interpreter internals may differ, so no patch was applied")
    builder, tuner = stock.InterpreterBuilder, autotuner.Autotuner
    options = stock.interpreter_builder.options
    if list(getattr(options, "allowed_dot_input_precisions", ())) != ["tf32", "tf32x3", "ieee"]:
        raise UnsupportedTritonError(f"triton {version}: the interpreter's allowed_dot_input_precisions are not "
                                     "('tf32', 'tf32x3', 'ieee'); no patch was applied")
    table: list[tuple[Any, str, Any]] = [(builder, "create_dot", _create_dot), (builder, "cast_impl", _cast_impl),
             (builder, "create_fp_to_fp", _create_fp_to_fp), (tuner, "prune_configs", _prune_configs),
             (stock.FunctionRewriter, "_transform_ast", _transform_ast), (stock, "_patch_lang", _patch_lang),
             (builder, "binary_op", _binary_op), (builder, "unary_op", _unary_op), (builder, "create_fma", _create_fma),
             (builder, "create_exp2", _create_exp2), (builder, "create_sqrt", _create_sqrt),
             (stock.ReduceOps, "sum", _reduce_sum), (stock.ReduceOps, "min_max", _reduce_min_max),
             (stock.ScanOps, "cumsum", _scan_cumsum), (stock, "_implicit_cvt", _implicit_cvt),
             (builder, "create_masked_load", _create_masked_load), (builder, "create_masked_store", _create_masked_store),
             (stock.GridExecutor, "_init_args_hst", _init_args_hst), (stock.GridExecutor, "__call__", _launch),
             (stock, "_get_np_dtype", _get_np_dtype)]
    for owner, name, _ in table:
        original = owner.__dict__.get(name)
        if original is None or list(inspect.signature(original).parameters) != _SIGNATURES[name]:
            raise UnsupportedTritonError(f"triton {version}: {owner.__name__}.{name} is missing or has "
                                         f"another signature than {_SIGNATURES[name]}; no patch was applied")
    # speed only: triton.language's type objects built once per shape (type_cache)
    for owner, name, replacement in type_cache.patches():
        key = name if inspect.ismodule(owner) else f"{owner.__name__}.{name}"
        original = owner.__dict__.get(name)
        if original is None or list(inspect.signature(original).parameters) != type_cache.SIGNATURES[key]:
            raise UnsupportedTritonError(f"triton {version}: {key} is missing or has another signature than "
                                         f"{type_cache.SIGNATURES[key]}; no patch was applied")
        table.append((owner, name, replacement))
    # GPU (nvidia backend's CUDAOptions): tl.dot also takes "bf16x3" and "bf16x6" (_dot_bf16xn).
    # Stock: the interpreter's options refuse them ("input_precision must be one of ...").
    # sanitize_overflow: stock (True) computes every integer add, sub and mul of fewer than 64 bits again in int64,
    # with two comparisons, for a device_assert that options.debug = False drops (semantic.device_assert), as the
    # GPU's compiler drops them as dead code: the same results (wrapping), a fifth of an interpreted kda law's time.
    table.append((stock.interpreter_builder, "options", dataclasses.replace(
        options, allowed_dot_input_precisions=(*options.allowed_dot_input_precisions, "bf16x3", "bf16x6"),
        sanitize_overflow=False)))
    # GPU: the nvidia backend's smallest dot shapes (codegen_fns["min_dot_size"]). Stock: (1, 1, 1).
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import min_dot_size
    codegen = stock.interpreter_builder.codegen_fns
    table.append((stock.interpreter_builder, "codegen_fns",
                  {**codegen, "min_dot_size": min_dot_size(GPUTarget("cuda", 90, 32))}))
    return table


def _base_kernel(kernel):
    """The innermost jit/interpreted function under autotune/heuristics wrappers."""
    from triton.runtime.autotuner import Autotuner, Heuristics

    while isinstance(kernel, (Autotuner, Heuristics)):
        kernel = kernel.fn
    return kernel


def _autotuner(kernel):
    """The Autotuner in the wrapper chain of ``kernel``; ValueError if there is none."""
    from triton.runtime.autotuner import Autotuner, Heuristics

    while isinstance(kernel, (Autotuner, Heuristics)):
        if isinstance(kernel, Autotuner):
            return kernel
        kernel = kernel.fn
    raise ValueError(f"kernel: expected a @triton.autotune kernel, got {type(kernel).__name__}")
