"""refcheck.runtime.interpreter: interpreted tl.dot and casts bit for bit against independent emulations.

The emulations share no code with the module: tl.dot is replayed in exact rational arithmetic
(``fractions.Fraction``) following the GPU's arithmetic as ``refcheck.runtime.interpreter`` documents it
(an FMA loop for fp32 "ieee", the Hopper tensor-core rule for the rest), operand values come from
torch's own conversions, and casts are compared with ``torch.Tensor.to``. The calibration probes
are also checked against the bits an H200 produced. Kernels are built as ``InterpretedFunction``
directly, so the tests do not depend on ``TRITON_INTERPRET``.
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from refcheck.runtime import interpreter

pytestmark = pytest.mark.skipif(not triton.__version__.startswith(interpreter.SUPPORTED_VERSIONS),
                                reason=f"refcheck.runtime.interpreter patches triton {interpreter.SUPPORTED_VERSIONS}")


def interpreted(fn):
    """Like ``@triton.jit`` under ``TRITON_INTERPRET=1``, whatever the environment says."""
    from triton.runtime.interpreter import InterpretedFunction

    return InterpretedFunction(fn)


@pytest.fixture(autouse=True)
def faithful():
    """Every test starts with the patches installed; the process's state is restored after."""
    was_enabled = interpreter.is_enabled()
    interpreter.enable()
    yield
    (interpreter.enable if was_enabled else interpreter.disable)()


# ---------------------------------------------------------------------------------------------
# tl.dot
# ---------------------------------------------------------------------------------------------

@interpreted
def _dot_kernel(a_ptr, b_ptr, c_ptr, out_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                PRECISION: tl.constexpr):
    m, n, k = tl.arange(0, M), tl.arange(0, N), tl.arange(0, K)
    a = tl.load(a_ptr + m[:, None] * K + k[None, :])
    b = tl.load(b_ptr + k[:, None] * N + n[None, :])
    c = tl.load(c_ptr + m[:, None] * N + n[None, :])
    d = tl.dot(a, b, c, input_precision=PRECISION, out_dtype=c.dtype)
    tl.store(out_ptr + m[:, None] * N + n[None, :], d)


def _exponent(x: Fraction, minimum: int = -(1 << 30)) -> int:
    """floor(log2|x|) of a non-zero ``x``, at least ``minimum`` (a format's subnormal exponent)."""
    magnitude = abs(x)
    exponent = magnitude.numerator.bit_length() - magnitude.denominator.bit_length()
    if Fraction(2) ** exponent > magnitude:
        exponent -= 1
    return max(exponent, minimum)


def _round(x: Fraction, mantissa: int, min_exponent: int, mode: str) -> Fraction:
    """``x`` rounded to ``mantissa`` fraction bits (subnormal below 2**min_exponent); mode "rne"
    (ties to even), "rna" (ties away from zero) or "rtz". No overflow: the tests stay in range."""
    if x == 0:
        return x
    quantum = Fraction(2) ** (_exponent(x, min_exponent) - mantissa)
    steps = abs(x) / quantum
    whole = math.floor(steps)
    rest = steps - whole
    if mode == "rna":
        whole += rest >= Fraction(1, 2)
    elif mode == "rne":
        whole += rest > Fraction(1, 2) or (rest == Fraction(1, 2) and whole % 2 == 1)
    return (whole if x > 0 else -whole) * quantum


def _exact(matrix):
    """Exact values of a 2-D tensor or array as nested lists of Fractions."""
    return [[Fraction(float(v)) for v in row] for row in np.asarray(matrix, dtype=np.float64)]


def _fma_dot(a, b, acc):
    """acc + a @ b as float32 fused multiply-adds, k = 0, 1, ... (an fp32 "ieee" dot on the GPU)."""
    acc = [row[:] for row in acc]
    for i, j in np.ndindex(len(a), len(b[0])):
        for k in range(len(b)):
            acc[i][j] = _round(acc[i][j] + a[i][k] * b[k][j], 23, -126, "rne")
    return acc


# Hopper tensor core per operand format: k per instruction, alignment bits, result mantissa bits,
# smallest exponent field. fp8 through wgmma (M >= 64) keeps 13 bits; fp8 via mma.sync is approximate.
MMA = {"tf32": (8, 25, 23, -126), "bf16": (16, 25, 23, -126), "fp16": (16, 25, 23, -14),
       "e4m3": (32, 13, 13, -6), "e5m2": (32, 13, 13, -14)}


def _mma_dot(a, b, acc, formats, fp16_accumulator=False):
    """acc + a @ b as the tensor core does it (measured bit for bit on an H200): per instruction,
    every product (exponent = sum of the operands' exponent fields) and the accumulator are truncated
    to ``align`` bits below the largest exponent, added exactly, and the sum truncated to ``bits``
    (rounded to nearest float16 for a float16 accumulator)."""
    step, align, bits, min_a = MMA[formats[0]]
    min_b = MMA[formats[1]][3]
    if formats[0] in ("e4m3", "e5m2") and len(a) < 64:
        align, bits = 25, 23
    acc = [row[:] for row in acc]
    for i, j in np.ndindex(len(a), len(b[0])):
        for k0 in range(0, len(b), step):
            ks = [k for k in range(k0, k0 + step) if a[i][k] and b[k][j]]
            exponents = [_exponent(a[i][k], min_a) + _exponent(b[k][j], min_b) for k in ks]
            exponents += [_exponent(acc[i][j], -126)] if acc[i][j] else []
            if not exponents:
                continue
            quantum = Fraction(2) ** (max(exponents) - align)
            total = sum(math.trunc(a[i][k] * b[k][j] / quantum) for k in ks) + math.trunc(acc[i][j] / quantum)
            if fp16_accumulator:
                acc[i][j] = _round(total * quantum, 10, -14, "rne")
            else:
                acc[i][j] = _round(total * quantum, bits, -126, "rtz")
    return acc


def _emulated_fp32_dot(a, b, acc, precision):
    """Triton's tl.dot of fp32 operands on Hopper: ieee = FMA loop; tf32 = truncated operands on the
    tensor core; tf32x3 = Triton's F32DotTC split (hi rounded to nearest, ties away; lo = x - hi)."""
    def each(matrix, f):
        return [[f(x) for x in row] for row in matrix]

    def tf32(x, mode):
        return _round(x, 10, -126, mode)

    if precision == "ieee":
        return _fma_dot(a, b, acc)
    if precision.startswith("bf16x"):
        return _emulated_bf16xn_dot(a, b, acc, precision)
    if precision == "tf32":
        return _mma_dot(each(a, lambda x: tf32(x, "rtz")), each(b, lambda x: tf32(x, "rtz")), acc, ("tf32", "tf32"))
    a_hi, b_hi = each(a, lambda x: tf32(x, "rna")), each(b, lambda x: tf32(x, "rna"))
    a_lo = [[tf32(x - h, "rtz") for x, h in zip(row, hrow)] for row, hrow in zip(a, a_hi)]
    b_lo = [[tf32(x - h, "rtz") for x, h in zip(row, hrow)] for row, hrow in zip(b, b_hi)]
    small = _mma_dot(a_lo, b_hi, _exact(np.zeros((len(a), len(b[0])))), ("tf32", "tf32"))
    small = _mma_dot(a_hi, b_lo, small, ("tf32", "tf32"))
    big = _mma_dot(a_hi, b_hi, small, ("tf32", "tf32"))
    return [[_round(x + c, 23, -126, "rne") for x, c in zip(row, crow)] for row, crow in zip(big, acc)]


def _emulated_bf16xn_dot(a, b, acc, precision):
    """Triton's BF16xN pattern (F32DotTC.cpp): each operand split into bf16 parts (hi = nearest
    bf16, mid = nearest bf16 of the rest, lo likewise), bf16 tensor-core dots chained from 0 over
    the smaller products (bf16x6: mid*mid, lo*hi, hi*lo, then mid*hi, hi*mid), hi*hi last, plus acc."""
    def parts(matrix):
        split = []
        for _ in range(3):
            part = [[_round(x, 7, -126, "rne") for x in row] for row in matrix]
            split.append(part)
            matrix = [[x - p for x, p in zip(row, prow)] for row, prow in zip(matrix, part)]
        return split

    pa, pb = parts(a), parts(b)
    order = [(1, 1), (2, 0), (0, 2)] if precision == "bf16x6" else []
    result = _exact(np.zeros((len(a), len(b[0]))))
    for i, j in order + [(1, 0), (0, 1), (0, 0)]:
        result = _mma_dot(pa[i], pb[j], result, ("bf16", "bf16"))
    return [[_round(x + c, 23, -126, "rne") for x, c in zip(row, crow)] for row, crow in zip(result, acc)]


def _operands(dtype, M=8, N=8, K=32, seed=0, exponents=(-8, 8)):
    """a [M,K], b [K,N] in ``dtype`` with magnitudes 2**exponents[0] .. 2**exponents[1], and c [M,N];
    fp32 operands also get exact tf32 ties (low 13 bits 0x1000), where round-away and round-to-even
    differ."""
    g = torch.Generator().manual_seed(seed)

    def draw(*shape):
        scale = torch.exp2(torch.randint(exponents[0], exponents[1] + 1, shape, generator=g).float())
        return torch.randn(*shape, generator=g) * scale

    a, b, c = draw(M, K), draw(K, N), draw(M, N)
    if dtype == torch.float32:
        for x in (a, b):
            bits = x.view(torch.int32)
            bits[::3] = (bits[::3] & ~0x1FFF) | 0x1000
    return a.to(dtype), b.to(dtype), c


FORMAT = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2"}
DOT_CASES = [  # operand dtype, accumulator dtype, input_precision, M (fp8: 64 goes through wgmma)
    (torch.float32, torch.float32, "ieee", 8),
    (torch.float32, torch.float32, "tf32", 8),
    (torch.float32, torch.float32, "tf32x3", 8),
    (torch.float32, torch.float32, "bf16x3", 8),
    (torch.float32, torch.float32, "bf16x6", 8),
    (torch.bfloat16, torch.float32, "tf32", 8),
    (torch.float16, torch.float32, "tf32", 8),
    (torch.float16, torch.float16, "tf32", 8),
    (torch.float8_e4m3fn, torch.float32, "tf32", 64),
    (torch.float8_e5m2, torch.float32, "tf32", 64),
    (torch.float8_e4m3fn, torch.float32, "tf32", 16),
]


@pytest.mark.parametrize("dtype, acc_dtype, precision, M", DOT_CASES,
                         ids=[f"{d}-{a}-{p}-M{m}".replace("torch.", "") for d, a, p, m in DOT_CASES])
def test_dot_equals_exact_emulation(dtype, acc_dtype, precision, M):
    K = 64 if M == 64 else 32
    a, b, c = _operands(dtype, M=M, K=K)
    c = c.to(acc_dtype)
    out = torch.empty_like(c)
    _dot_kernel[(1, )](a, b, c, out, M, 8, K, precision)
    a, b, acc = _exact(a.float()), _exact(b.float()), _exact(c.float())
    if dtype == torch.float32:
        expected = _emulated_fp32_dot(a, b, acc, precision)
    else:
        expected = _mma_dot(a, b, acc, (FORMAT[dtype], FORMAT[dtype]), fp16_accumulator=acc_dtype == torch.float16)
    expected = torch.tensor([[float(x) for x in row] for row in expected]).to(acc_dtype)
    width = torch.int16 if acc_dtype == torch.float16 else torch.int32
    assert torch.equal(out.view(width), expected.view(width))


def test_dot_mixed_fp8_operands():
    a, _, c = _operands(torch.float8_e4m3fn, M=64, K=64, seed=1)
    _, b, _ = _operands(torch.float8_e5m2, M=64, K=64, seed=2)
    out = torch.empty_like(c)
    _dot_kernel[(1, )](a, b, c, out, 64, 8, 64, "tf32")
    expected = _mma_dot(_exact(a.float()), _exact(b.float()), _exact(c), ("e4m3", "e5m2"))
    assert torch.equal(out, torch.tensor([[float(x) for x in row] for row in expected]).float())


def test_dot_fp8_subnormal_operands():
    """A subnormal operand's exponent field is the format's smallest (e4m3: -6), not log2 of it."""
    a, b, c = _operands(torch.float8_e4m3fn, M=64, K=64, exponents=(-10, -3))
    assert (a.float().abs() < 2 ** -6).float().mean() > 0.3
    out = torch.empty_like(c)
    _dot_kernel[(1, )](a, b, c, out, 64, 8, 64, "tf32")
    expected = _mma_dot(_exact(a.float()), _exact(b.float()), _exact(c), ("e4m3", "e4m3"))
    assert torch.equal(out, torch.tensor([[float(x) for x in row] for row in expected]).float())


def test_dot_default_precision_follows_triton(monkeypatch):
    """No input_precision: tf32 (Triton's default), or TRITON_F32_DEFAULT when set."""
    a, b, c = _operands(torch.float32)
    results = {}
    for precision in ("tf32", "ieee", None):
        results[precision] = torch.empty_like(c)
        _dot_kernel[(1, )](a, b, c, results[precision], 8, 8, 32, precision)
    assert torch.equal(results[None], results["tf32"]) and not torch.equal(results["tf32"], results["ieee"])
    monkeypatch.setenv("TRITON_F32_DEFAULT", "ieee")
    _dot_kernel[(1, )](a, b, c, results[None], 8, 8, 32, None)
    assert torch.equal(results[None], results["ieee"])


def test_stock_interpreter_is_what_enable_fixes():
    """The stock interpreter ignores input_precision and multiplies bf16 bit patterns."""
    a, b, c = _operands(torch.float32)
    x, y, z = _operands(torch.bfloat16)

    def run():
        tf32, ieee, bf16 = torch.empty_like(c), torch.empty_like(c), torch.empty_like(c)
        _dot_kernel[(1, )](a, b, c, tf32, 8, 8, 32, "tf32")
        _dot_kernel[(1, )](a, b, c, ieee, 8, 8, 32, "ieee")
        _dot_kernel[(1, )](x, y, z, bf16, 8, 8, 32, "tf32")
        truth = x.double() @ y.double() + z.double()
        return torch.equal(tf32, ieee), float((bf16 - truth).norm() / truth.norm())

    interpreter.disable()
    stock_same, stock_error = run()
    interpreter.enable()
    same, error = run()
    assert stock_same and stock_error > 1e3
    assert not same and error < 1e-6


def test_calibration_probes_bitwise_equal_to_the_gpus():
    """The dot, cast and math probes of benchmarks/interpreter_calibration.py give the bits an H200 and an H100
    (triton 3.6) gave, as recorded in benchmarks/interpreter_calibration_h200.json and _h100.json: every probe
    a file records, and every probe recorded by at least one (the H100's run is the later one, with the
    bf16x3 dots)."""
    benchmarks = Path(__file__).resolve().parents[1] / "benchmarks"
    spec = importlib.util.spec_from_file_location("interpreter_calibration", benchmarks / "interpreter_calibration.py")
    calibration = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(calibration)
    dot_probe, cast_probe, math_probe = calibration.define_kernels(interpreted)
    measured = {**calibration.dot_probes(dot_probe, "cpu"), **calibration.cast_probes(cast_probe, "cpu"),
                **calibration.math_probes(math_probe, "cpu")}
    fields = ("digest", "bits")
    seen = set()
    for gpu in ("h200", "h100"):
        recorded = json.loads((benchmarks / f"interpreter_calibration_{gpu}.json").read_text())["probes"]
        common = [key for key in measured if key in recorded]
        differ = [key for key in common if [measured[key].get(f) for f in fields] != [recorded[key].get(f) for f in fields]]
        assert not differ, f"not bitwise equal to the {gpu}: {differ}"
        seen.update(common)
    assert seen == set(measured), f"recorded on no GPU: {sorted(set(measured) - seen)}"


# ---------------------------------------------------------------------------------------------
# casts
# ---------------------------------------------------------------------------------------------

@interpreted
def _cast_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr, RTZ: tl.constexpr):
    i = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i, mask=i < n)
    if RTZ:
        y = x.to(y_ptr.dtype.element_ty, fp_downcast_rounding="rtz")
    else:
        y = x.to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + i, y, mask=i < n)


def _cast(x, dtype, rtz=False):
    y = torch.empty(x.shape, dtype=dtype)
    _cast_kernel[(1, )](x, y, x.numel(), triton.next_power_of_2(x.numel()), rtz)
    return y


def _all_values(dtype):
    """Every code of a <= 16-bit float dtype, as that dtype."""
    bits = 8 * dtype.itemsize
    codes = torch.arange(2 ** bits, dtype=torch.int32).to(torch.int16 if bits == 16 else torch.uint8)
    return codes.view(dtype)


def _cast_inputs(dtype, n=100_000, seed=0):
    """fp32 inputs: exact midpoints between neighbouring ``dtype`` values (ties), log-uniform values
    over its whole range down to below half its smallest subnormal, random fp32 bit patterns
    (subnormals, huge values, NaN payloads) and the special values."""
    g = torch.Generator().manual_seed(seed)
    grid = _all_values(dtype).double()
    grid = grid[torch.isfinite(grid) & (grid >= 0)].unique()
    ties = ((grid[:-1] + grid[1:]) / 2).float()
    tiny, huge = float(grid[1]), float(grid[-1])
    quarter = n // 4
    sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0)
    midpoints = ties[torch.randint(0, ties.numel(), (quarter, ), generator=g)]
    spread = torch.exp2(torch.empty(quarter).uniform_(math.log2(tiny) - 3, math.log2(huge) + 1, generator=g))
    raw = torch.randint(-2 ** 31, 2 ** 31, (quarter, ), generator=g, dtype=torch.int64)
    raw = raw.to(torch.int32).view(torch.float32)
    specials = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, huge, -huge, tiny, tiny / 2, -tiny / 2,
                             3 * tiny / 2, huge * (1 + 2 ** -4), 2 * huge, 1.0, -1.0])
    x = torch.cat([midpoints, spread, raw, specials])
    x[: 2 * quarter] *= sign[: 2 * quarter]
    return torch.cat([x, torch.randn(n - x.numel(), generator=g)])


def _assert_same_bits(got, expected):
    width = torch.int16 if got.element_size() == 2 else (torch.uint8 if got.element_size() == 1 else torch.int32)
    nan = expected.float().isnan()
    assert torch.equal(got.float().isnan(), nan), "NaN where torch has none, or the reverse"
    mismatches = int((got.view(width) != expected.view(width))[~nan].sum())
    assert mismatches == 0, f"{mismatches} of {got.numel()} values differ from torch's rounding"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_cast_rounds_like_torch(dtype):
    x = _cast_inputs(dtype)
    _assert_same_bits(_cast(x, dtype), x.to(dtype))


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
def test_cast_to_fp8_rounds_and_saturates(dtype):
    """Hopper's cvt.rn.satfinite: torch's rounding of the value clamped to the finite range."""
    x = _cast_inputs(dtype)
    largest = float(torch.finfo(dtype).max)
    _assert_same_bits(_cast(x, dtype), x.clamp(-largest, largest).to(dtype))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
def test_upcast_is_exact(dtype):
    values = _all_values(dtype)
    _assert_same_bits(_cast(values, torch.float32), values.float())


def test_cast_rtz_truncates():
    x = _cast_inputs(torch.bfloat16)
    finite = torch.isfinite(x)
    expected = torch.where(finite, (x.view(torch.int32) & ~0xFFFF).view(torch.float32), x).to(torch.bfloat16)
    _assert_same_bits(_cast(x, torch.bfloat16, rtz=True)[finite], expected[finite])


def test_stock_cast_truncates():
    x = _cast_inputs(torch.bfloat16, n=4096)
    interpreter.disable()
    stock = _cast(x, torch.bfloat16)
    interpreter.enable()
    assert int((stock.view(torch.int16) != x.to(torch.bfloat16).view(torch.int16)).sum()) > 1000


# ---------------------------------------------------------------------------------------------
# autotune
# ---------------------------------------------------------------------------------------------

BLOCKS = (16, 32, 64)


def _tuned():
    """A fresh autotuned kernel (fresh config cache) whose result does not depend on BLOCK."""
    @triton.autotune(configs=[triton.Config({"BLOCK": b}) for b in BLOCKS], key=["n"])
    @interpreted
    def double(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + i, 2 * tl.load(x_ptr + i, mask=i < n), mask=i < n)

    return double


def _launch(kernel, x):
    y = torch.full_like(x, math.nan)
    kernel[lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]), )](x, y, x.numel())
    return y


def test_autotune_runs_first_config_by_default():
    kernel, x = _tuned(), torch.randn(100)
    assert torch.equal(_launch(kernel, x), 2 * x)
    assert kernel.best_config is interpreter.configs(kernel)[0]


def test_autotune_each_config_runs_every_config():
    kernel, x = _tuned(), torch.randn(100)
    _launch(kernel, x)
    cached = dict(kernel.cache)
    used = []
    for config in interpreter.each_config(kernel):
        assert torch.equal(_launch(kernel, x), 2 * x)
        used.append(kernel.best_config.kwargs["BLOCK"])
        assert kernel.best_config is config
    assert used == list(BLOCKS)
    assert kernel.cache == cached
    with interpreter.pin_config(kernel, 2):
        _launch(kernel, x)
        assert kernel.best_config.kwargs["BLOCK"] == 64


def test_pin_config_rejects_bad_arguments():
    kernel = _tuned()
    with pytest.raises(ValueError, match="config"):
        with interpreter.pin_config(kernel, 3):
            pass
    with pytest.raises(ValueError, match="config"):
        with interpreter.pin_config(kernel, triton.Config({"BLOCK": 16})):
            pass
    with pytest.raises(ValueError, match="kernel"):
        interpreter.configs(_cast_kernel)


def test_stock_autotune_needs_a_driver():
    interpreter.disable()
    with pytest.raises(RuntimeError, match="driver"):
        _launch(_tuned(), torch.randn(100))


# ---------------------------------------------------------------------------------------------
# enable / disable / version
# ---------------------------------------------------------------------------------------------

def test_enable_is_idempotent_and_disable_restores():
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.interpreter import InterpreterBuilder

    interpreter.enable()
    patched = (InterpreterBuilder.create_dot, InterpreterBuilder.cast_impl, Autotuner.prune_configs)
    interpreter.enable()
    assert (InterpreterBuilder.create_dot, InterpreterBuilder.cast_impl, Autotuner.prune_configs) == patched
    interpreter.disable()
    interpreter.disable()
    assert not interpreter.is_enabled()
    assert InterpreterBuilder.create_dot is not patched[0] and Autotuner.prune_configs is not patched[2]
    a, b, c = _operands(torch.float32)
    tf32, ieee = torch.empty_like(c), torch.empty_like(c)
    _dot_kernel[(1, )](a, b, c, tf32, 8, 8, 32, "tf32")
    _dot_kernel[(1, )](a, b, c, ieee, 8, 8, 32, "ieee")
    assert torch.equal(tf32, ieee)      # stock behaviour is back


def test_numpy_dtypes_are_stocks_answers():
    from triton.runtime import interpreter as stock

    interpreter.enable()
    original = interpreter._stock("_get_np_dtype")
    assert stock._get_np_dtype is not original      # the memo is what the interpreter calls
    scalars = [tl.int1, tl.int8, tl.uint8, tl.int16, tl.uint16, tl.int32, tl.uint32, tl.int64, tl.uint64, tl.float16,
               tl.bfloat16, tl.float32, tl.float64, tl.float8e5, tl.float8e4nv]
    types = [*scalars, *(tl.block_type(t, [4, 2]) for t in scalars), tl.pointer_type(tl.float32),
             tl.block_type(tl.pointer_type(tl.bfloat16), [8])]
    for _ in range(2):                               # answers made, then answers kept
        assert [stock._get_np_dtype(t) for t in types] == [original(t) for t in types]


def test_unknown_version_raises(monkeypatch):
    interpreter.disable()
    monkeypatch.setattr(triton, "__version__", "3.7.0")
    with pytest.raises(interpreter.UnsupportedTritonError, match="3.7.0"):
        interpreter.enable()
    assert not interpreter.is_enabled()


def test_changed_internals_raise(monkeypatch):
    from triton.runtime.interpreter import InterpreterBuilder

    interpreter.disable()
    monkeypatch.setattr(InterpreterBuilder, "create_dot", lambda self, a, b, d, input_precision: None)
    with pytest.raises(interpreter.UnsupportedTritonError, match="create_dot"):
        interpreter.enable()
    assert not interpreter.is_enabled()


def _python(code: str, **env) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | env
    return subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1],
                          env=environment, capture_output=True, text=True, timeout=120)


def test_interpretation_must_precede_import_of_triton():
    late = _python("import triton\nfrom refcheck.runtime import interpreter\ninterpreter.interpret_new_kernels()")
    assert late.returncode != 0 and "before the first `import triton`" in late.stderr
    early = _python("from refcheck.runtime import interpreter\ninterpreter.interpret_new_kernels()\n"
                    "import triton.language as tl\ninterpreter.enable()\n"
                    "assert interpreter.is_interpreted(tl.zeros) and interpreter.is_interpreted()")
    assert early.returncode == 0, early.stderr


def test_our_kernels_on_cpu_tensors_need_the_interpreter_and_get_the_faithful_one():
    """A newcomer's script calling ``refcheck.optimized`` on CPU tensors: without the interpreter, a
    ValueError naming the argument and the fix, before any kernel runs; with ``TRITON_INTERPRET=1`` set by
    hand (not through refcheck), the faithful interpreter is switched on, so bf16 attention is right
    (the stock interpreter's o was off by 2.6e9 relative)."""
    call = ("import torch\nfrom refcheck import optimized, references\ntorch.manual_seed(0)\n"
            "q = torch.randn(1, 70, 2, 32, dtype=torch.bfloat16)\n")
    bare = _python(call + "optimized.attention(q, q, q)")
    assert bare.returncode != 0 and "ValueError: q: a tensor on cpu" in bare.stderr, bare.stderr
    assert "configure_backend('cpu')" in bare.stderr
    by_hand = _python(call + "o, _ = optimized.attention(q, q, q, causal=True)\n"
                      "r, _ = references.attention(*(q.double(),) * 3, causal=True)\n"
                      "print(float((o.double() - r).norm() / r.norm()))", TRITON_INTERPRET="1")
    assert by_hand.returncode == 0, by_hand.stderr
    assert float(by_hand.stdout) < 1e-2


def test_is_interpreted():
    from triton.runtime.jit import JITFunction

    def body(x_ptr):
        pass

    assert interpreter.is_interpreted(_dot_kernel) and interpreter.is_interpreted(_tuned())
    assert not interpreter.is_interpreted(JITFunction(body))


# ---------------------------------------------------------------------------------------------
# What the compiler makes of a kernel that the stock interpreter does not: loop indices, builtin
# aliases, bf16 arithmetic, float arguments
# ---------------------------------------------------------------------------------------------

@interpreted
def _loop_kernel(out_ptr, N: tl.constexpr):
    for i in range(N):
        tl.store(out_ptr + i, (i * 1073741824 * 4).to(tl.int64))    # int32 index: 2**32 i wraps to 0
    for j in tl.range(N, 2 * N):
        tl.store(out_ptr + j, j.to(tl.int64) * 1073741824 * 4)      # int64 before multiplying: 2**32 j
    for s in tl.static_range(2 * N, 3 * N):                          # constexpr: a Python int
        tl.store(out_ptr + s, s * 1073741824 * 4)


def test_loop_index_is_a_tensor_as_compiled():
    """A `range`/`tl.range` index is an int32 tensor (`.to()` works, arithmetic wraps in int32
    before the cast); a `tl.static_range` index is a Python int. Stock: every index is an int."""
    out = torch.zeros(6, dtype=torch.int64)
    _loop_kernel[(1, )](out, 2)
    assert out.tolist() == [0, 0, 2 * 2 ** 32, 3 * 2 ** 32, 4 * 2 ** 32, 5 * 2 ** 32]
    interpreter.disable()
    with pytest.raises(Exception, match="'int' object has no attribute 'to'"):
        _loop_kernel[(1, )](out, 2)


@interpreted
def _wrap_kernel(x_ptr, out_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    x = tl.load(x_ptr + i)
    tl.store(out_ptr + i, x * 65536 + x - 7)


def test_integer_arithmetic_wraps_without_overflow_checks():
    """int32 add, sub and mul wrap as on the GPU, with no overflow check computed (the stock interpreter computes
    each again in int64 for an assert that ``debug=False`` drops): the same bits with and without the checks."""
    from triton.runtime import interpreter as stock
    x = torch.tensor([2 ** 31 - 1, -2 ** 31, 123456789, -98765], dtype=torch.int32)
    expected = ((x.long() * 65536 + x.long() - 7 + 2 ** 31) % 2 ** 32 - 2 ** 31).int()
    out = torch.empty_like(x)
    _wrap_kernel[(1, )](x, out, 4)
    assert torch.equal(out, expected) and not stock.interpreter_builder.options.sanitize_overflow
    interpreter.disable()
    stock_out = torch.empty_like(x)
    _wrap_kernel[(1, )](x, stock_out, 4)
    assert torch.equal(stock_out, expected) and stock.interpreter_builder.options.sanitize_overflow


@interpreted
def _scalar_condition_kernel(x_ptr, out_ptr, n, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(out_ptr + i, tl.load(x_ptr + i, mask=(i < n) & (n % 2 == 1), other=0.0), mask=i < n)


def test_a_comparison_is_int1_as_compiled():
    """A scalar comparison ANDed into a block mask (``block & (n % 2 == 1)``) is a mask, as compiled.
    Stock: the comparison keeps its operands' type, its splat makes int32 data, and the load raises
    "mask has unsupported dtype"."""
    x = torch.randn(8)
    for n, expected in ((5, torch.cat([x[:5], torch.zeros(3)])), (6, torch.zeros(8))):
        out = torch.zeros(8)
        _scalar_condition_kernel[(1, )](x, out, n, 8)
        assert torch.equal(out, expected)
    interpreter.disable()
    with pytest.raises(Exception, match="mask has unsupported dtype"):
        _scalar_condition_kernel[(1, )](x, torch.zeros(8), 5, 8)


_maximum = tl.maximum      # a builtin under another name, as FLA's `gather = tl.gather`


@interpreted
def _alias_kernel(x_ptr, out_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(out_ptr + i, _maximum(tl.load(x_ptr + i), 0.0))


def test_builtin_alias_is_a_builtin():
    x = torch.randn(16)
    out = torch.empty_like(x)
    _alias_kernel[(1, )](x, out, 16)
    assert torch.equal(out, x.clamp(min=0))
    interpreter.disable()
    with pytest.raises(Exception, match="forget to add @triton.jit"):
        _alias_kernel[(1, )](x, out, 16)


@interpreted
def _bf16_kernel(x_ptr, y_ptr, out_ptr, red_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    x, y = tl.load(x_ptr + i), tl.load(y_ptr + i)
    results = (x + y, x - y, x * y, x / y, -x, tl.maximum(x, y), tl.where(x < y, x, y), tl.fma(x, y, x))
    for k in tl.static_range(len(results)):
        tl.store(out_ptr + k * N + i, results[k])
    tl.store(out_ptr + len(results) * N + i, tl.cumsum(x, 0))
    tl.store(red_ptr, tl.sum(x, 0))
    tl.store(red_ptr + 1, tl.max(x, 0))
    tl.store(red_ptr + 2, tl.min(x, 0))


def _bf16_tree_sum(x: torch.Tensor) -> torch.Tensor:
    while x.numel() > 1:
        x = torch.cat([x, x.new_zeros(x.numel() % 2)])
        x = x[0::2] + x[1::2]          # torch: the sum of the values rounded to bf16
    return x[0]


def test_bf16_arithmetic_on_values():
    """bf16 elementwise ops, fma, sum/max/min and cumsum compute on the values, each result rounded
    to nearest even bf16 (torch's bf16 arithmetic rounds the same way); stock computes on the
    uint16 bit patterns."""
    g = torch.Generator().manual_seed(0)
    x, y = (torch.randn(16, generator=g) * 4).bfloat16(), (torch.randn(16, generator=g) * 4).bfloat16()
    out, red = torch.empty(9, 16, dtype=torch.bfloat16), torch.empty(3, dtype=torch.bfloat16)
    _bf16_kernel[(1, )](x, y, out, red, 16)
    running, cumsum = x[0], [x[0]]
    for v in x[1:]:
        running = running + v
        cumsum.append(running)
    fma = (x.double() * y.double() + x.double()).bfloat16()
    expected = torch.stack([x + y, x - y, x * y, x / y, -x, torch.maximum(x, y), torch.where(x < y, x, y), fma,
                            torch.stack(cumsum)])
    assert torch.equal(out.view(torch.int16), expected.view(torch.int16))
    assert torch.equal(red, torch.stack([_bf16_tree_sum(x), x.max(), x.min()]))
    interpreter.disable()
    _bf16_kernel[(1, )](x, y, out, red, 16)
    assert not torch.equal(out[:3], expected[:3]) and not torch.equal(red[0], expected[0, 0])


@interpreted
def _scale_kernel(x_ptr, out_ptr, scale, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(out_ptr + i, tl.load(x_ptr + i) * scale)


def test_float_argument_is_fp32(monkeypatch):
    """A Python float argument is an fp32 tensor, so bf16 * scale is computed in fp32; stock keeps
    it a Python number, a literal that takes the tensor's dtype: bf16(0.1), product in bf16."""
    from triton.runtime import interpreter as stock

    x = torch.randn(16, generator=torch.Generator().manual_seed(0)).bfloat16()
    out = torch.empty(16)
    _scale_kernel[(1, )](x, out, 0.1, 16)
    assert torch.equal(out, x.float() * torch.tensor(0.1, dtype=torch.float32))
    monkeypatch.setattr(stock, "_implicit_cvt", interpreter._stock("_implicit_cvt"))
    _scale_kernel[(1, )](x, out, 0.1, 16)
    assert torch.equal(out, (x * torch.tensor(0.1).bfloat16()).float())
    assert not torch.equal(out, x.float() * torch.tensor(0.1, dtype=torch.float32))


@interpreted
def _copy_rows(x_ptr, y_ptr, n, ROWS: tl.constexpr, MASKED: tl.constexpr):
    """y[i] = x[i] for i < ROWS: masked to n, or not (reading past x's end when ROWS > n)."""
    i = tl.arange(0, ROWS)
    if MASKED:
        tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n, other=0.0), mask=i < n)
    else:
        tl.store(y_ptr + i, tl.load(x_ptr + i))


def test_a_read_past_the_end_of_a_tensor_is_an_illegal_memory_access():
    """What kills a GPU's CUDA context (or silently reads a neighbour) fails on the CPU too; the
    same kernel masked to the tensor's length runs."""
    x, y = torch.randn(10), torch.zeros(16)
    _copy_rows[(1,)](x, y, 10, ROWS=16, MASKED=True)
    assert torch.equal(y[:10], x)
    past_x = r"illegal memory access: a load of 6 of 16 active lanes .* past the end of argument 'x_ptr'"
    with pytest.raises(Exception, match=past_x):
        _copy_rows[(1,)](x, y, 10, ROWS=16, MASKED=False)
    with pytest.raises(Exception, match=r"illegal memory access: a store"):
        _copy_rows[(1,)](torch.randn(16), torch.zeros(10), 16, ROWS=16, MASKED=False)


@interpreted
def _exp2_kernel(x_ptr, y_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(y_ptr + i, tl.math.exp2(tl.load(x_ptr + i)))


def test_fp32_exp2_flushes_subnormal_results_and_keeps_infinities():
    """exp2 as sm_90 computes it: a subnormal result is a zero, an overflow stays inf, and no
    arithmetic on the inf lanes warns (pyproject makes refcheck's warnings errors, as in a law test of
    FLA's kernels, whose exp2 meets such lanes)."""
    g = torch.Generator().manual_seed(7)
    x = torch.cat([torch.empty(60).uniform_(-140, 140, generator=g),
                   torch.tensor([-130.0, -149.0, 200.0, float("inf")])])
    y = torch.empty_like(x)
    _exp2_kernel[(1,)](x, y, 64)
    exact = torch.exp2(x.double())
    expected = torch.where(exact < 2.0 ** -126, torch.zeros_like(exact), exact).float()
    torch.testing.assert_close(y, expected, rtol=2.0 ** -22, atol=0)   # exp2's own rounding aside
    assert y[expected == 0].eq(0).all() and y[-4:-2].eq(0).all() and y[-2:].isinf().all()


@interpreted
def _tanh_kernel(x_ptr, y_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(y_ptr + i, libdevice.tanh(tl.load(x_ptr + i)))


def test_libdevice_tanh_is_computed_and_the_stub_restored():
    """``libdevice.tanh`` (a stub that returns None in the stock interpreter) is numpy's tanh of the fp32 values,
    within 2 ulp of the exact tanh as ``__nv_tanhf`` is on the GPU; after the launch the module holds its stub
    again, and an fp16 argument is refused as libdevice refuses it."""
    from triton.language.extra import libdevice as stub
    before = stub.tanh
    g = torch.Generator().manual_seed(8)
    x = torch.cat([torch.empty(60).uniform_(-12, 12, generator=g), torch.tensor([1e-6, -3e-4, 0.0, float("inf")])])
    y = torch.empty_like(x)
    _tanh_kernel[(1,)](x, y, 64)
    torch.testing.assert_close(y.double(), torch.tanh(x.double()), rtol=2 * 2.0 ** -23, atol=0)
    assert stub.tanh is before
    with pytest.raises(Exception, match="fp32 or fp64"):
        _tanh_kernel[(1,)](x.half(), y.half(), 64)


def test_the_operand_shortcut_gives_what_the_stock_type_checking_gives():
    """``type_cache``'s binary-operand shortcut against the stock ``binary_op_type_checking_impl``: for
    every pair of types and shapes (same and different, blocks and scalars, pointers) and every flag, the
    same result types and the same values, or the same error."""
    import itertools

    import numpy as np
    import triton.language as tl
    from triton.language.semantic import TritonSemantic
    from triton.runtime import interpreter as stock

    from refcheck.runtime import type_cache

    interpreter.disable()      # the stock function itself (the fixture restores the patches after)
    stock_operands = TritonSemantic.binary_op_type_checking_impl
    shortcut = next(fn for _, name, fn in type_cache.patches() if name == "binary_op_type_checking_impl")
    semantic = TritonSemantic(stock.interpreter_builder)
    dtypes = [tl.float16, tl.bfloat16, tl.float32, tl.float64, tl.int8, tl.int32, tl.int64, tl.uint32,
              tl.pointer_type(tl.float32)]

    def value(dtype, shape):
        np_dtype = np.uint64 if dtype.is_ptr() else stock._get_np_dtype(dtype)
        data = (np.arange(int(np.prod(shape)) or 1) % 5 + 1).astype(np_dtype).reshape(shape or ())
        return tl.tensor(stock.TensorHandle(data, dtype.scalar if not dtype.is_ptr() else dtype),
                         tl.block_type(dtype, list(shape)) if shape else dtype)

    def outcome(fn, lhs, rhs, flags):
        try:
            out = fn(semantic, lhs, rhs, *flags)
        except Exception as err:
            return type(err).__name__
        return [(str(t.type), t.handle.data.dtype, t.handle.data.tobytes()) for t in out]

    checked = 0
    for (a, b), (sa, sb) in itertools.product(itertools.product(dtypes, repeat=2), [((4,), (4,)), ((2, 4), (2, 4)),
                                                                                   ((1, 4), (2, 4)), ((), ())]):
        for flags in itertools.product([False, True], repeat=4):
            lhs, rhs = value(a, sa), value(b, sb)
            assert outcome(shortcut, lhs, rhs, flags) == outcome(stock_operands, lhs, rhs, flags), (a, b, sa, sb, flags)
            checked += 1
    assert checked == len(dtypes) ** 2 * 4 * 16


def test_block_types_from_a_cached_shape_are_the_stock_ones():
    """``type_cache``'s block types, built from a list of ints and from another block type's own shape (what
    ``with_element_ty`` and the interpreter's ``to_ir`` pass), field by field the stock ones, every time."""
    import triton.language as tl

    def fields(t):
        return (t.element_ty, t.name, t.numel.value if hasattr(t.numel, "value") else t.numel,
                list(t.shape.values), str(t.shape.type))

    def built():
        out = []
        for dtype in (tl.float32, tl.bfloat16, tl.int32, tl.pointer_type(tl.float16)):
            for shape in ([4], [2, 8], [1, 16, 2]):
                first = tl.block_type(dtype, shape)
                for _ in range(2):   # the second time from the cache
                    out.append(fields(tl.block_type(dtype, list(shape))))
                    out.append(fields(first.with_element_ty(tl.float16)))
                    out.append(fields(tl.block_type(tl.int64, first.shape)))
        return out

    patched = built()
    interpreter.disable()      # the stock constructor (the fixture restores the patches after)
    assert patched == built()


def test_the_broadcast_shortcut_gives_what_the_stock_broadcast_gives():
    """``type_cache``'s broadcast shortcut (two scalars, or two blocks of one shape, returned as they are) against the
    stock ``broadcast_impl_value``: for scalars, blocks of one shape, of broadcastable and of incompatible shapes and
    ranks, the same result types and values, or the same error."""
    import itertools

    import numpy as np
    import triton.language as tl
    from triton.language.semantic import TritonSemantic
    from triton.runtime import interpreter as stock

    from refcheck.runtime import type_cache

    interpreter.disable()      # the stock function itself (the fixture restores the patches after)
    stock_broadcast = TritonSemantic.broadcast_impl_value
    shortcut = next(fn for _, name, fn in type_cache.patches() if name == "broadcast_impl_value")
    semantic = TritonSemantic(stock.interpreter_builder)

    def value(dtype, shape):
        data = (np.arange(int(np.prod(shape)) or 1) % 5 + 1).astype(stock._get_np_dtype(dtype)).reshape(shape or ())
        return tl.tensor(stock.TensorHandle(data, dtype), tl.block_type(dtype, list(shape)) if shape else dtype)

    def outcome(fn, lhs, rhs):
        try:
            out = fn(semantic, lhs, rhs)
        except Exception as err:
            return type(err).__name__
        return [(str(t.type), t.handle.data.dtype, t.handle.data.shape, t.handle.data.tobytes()) for t in out]

    shapes = [(), (4,), (2, 4), (1, 4), (2, 1), (8, 4), (8,)]
    checked = same = 0
    for (a, b), (sa, sb) in itertools.product(itertools.product([tl.float32, tl.int32], repeat=2),
                                              itertools.product(shapes, repeat=2)):
        lhs, rhs = value(a, sa), value(b, sb)
        assert outcome(shortcut, lhs, rhs) == outcome(stock_broadcast, lhs, rhs), (a, b, sa, sb)
        checked += 1
        same += sa == sb
    assert checked == 4 * len(shapes) ** 2 and same == 4 * len(shapes)
