"""Calibrate the faithful interpreter against a GPU: same probes, same inputs, error against float64.

    python benchmarks/interpreter_calibration.py --out gpu.json        # on a GPU: compiled kernels
    python benchmarks/interpreter_calibration.py --out cpu.json        # no GPU: interpreted + enable()
    python benchmarks/interpreter_calibration.py --stock --out stock.json   # interpreted, stock
    python benchmarks/interpreter_calibration.py --compare gpu.json cpu.json

Probes (inputs drawn on the CPU from fixed seeds, so both sides see the same bits):
* ``dot/<operands>/<inputs>``: C [128, 128] = A [128, 256] @ B [256, 128] by a tiled kernel (64x64
  tiles, the accumulator carried over four k-blocks of 64) for fp32 operands in each
  ``input_precision`` (fp32-ieee, fp32-tf32, fp32-tf32x3, fp32-bf16x3), bf16, fp16, fp8 e4m3 and e5m2 operands,
  and fp16 operands with an fp16 accumulator (fp16-acc16); inputs "normal" (standard normal) or
  "wide" (times 2**j, j uniform in [-6, 6], [-9, 2] for fp8: subnormals included). Error against
  the float64 product of the operand values.
* ``cast/<dtype>``: 10^5 fp32 values (log-uniform over the format's range and exact ties between
  neighbouring values) cast with ``.to()``; error against the input, and mismatches against torch's
  rounding (for fp8, of the value clamped to the finite range: Hopper's satfinite).
* ``cast_specials/<dtype>``: the stored bits of +-0, +-Inf, NaN, values past the largest finite one,
  3e38, and a quarter, half and three quarters of the smallest subnormal.
* ``math_specials/<op>``: fp32 ``tl.log2``, ``tl.exp2``, ``tl.sqrt``, ``x * 1024``, ``x / 0.5``, ``x + x`` of
  subnormal inputs (or with subnormal results), powers of two: the stored bits (``MATH_INPUTS``).
* ``kda/<dtype>/<mode>``: ``optimized.kda`` against ``references.kda`` in float64 (output ``o``),
  when both import.

The error of every probe is ``refcheck.model.metrics.rel_rms`` (relative RMS, floor 1e-30); each record
also holds a digest of the output bits. ``--compare`` prints one Markdown table: the error on each
side, their ratio (flagged outside [1/1.5, 1.5]) and whether the outputs are bitwise identical; it
exits 1 when a row is flagged.

Runs on triton 3.6 (GPU) and 3.9 (interpreter); about 40 s on an H200, 20 s on the CPU.
"""
from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from refcheck.model.metrics import rel_rms  # noqa: E402

RATIO_LIMIT = 1.5
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
          "fp8e4m3": torch.float8_e4m3fn, "fp8e5m2": torch.float8_e5m2}
DOT_PROBES = {  # name -> (operand dtype, input_precision, fp16 accumulator)
    "fp32-ieee": ("fp32", "ieee", False), "fp32-tf32": ("fp32", "tf32", False),
    "fp32-tf32x3": ("fp32", "tf32x3", False), "fp32-bf16x3": ("fp32", "bf16x3", False), "bf16": ("bf16", "tf32", False),
    "fp16": ("fp16", "tf32", False), "fp16-acc16": ("fp16", "tf32", True),
    "fp8e4m3": ("fp8e4m3", "tf32", False), "fp8e5m2": ("fp8e5m2", "tf32", False)}
M, N, K, BLOCK = 128, 128, 256, 64


def define_kernels(decorate=None):
    """The probe kernels, decorated by ``decorate`` (default ``triton.jit``). triton is imported here,
    after ``measure`` has decided whether to interpret (``TRITON_INTERPRET`` must precede the first
    ``import triton``), and bound as a module global, where the interpreter looks for ``tl``."""
    global triton, tl
    import triton
    import triton.language as tl

    decorate = decorate or triton.jit

    @decorate
    def dot_probe(a_ptr, b_ptr, c_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                  BLOCK: tl.constexpr, PRECISION: tl.constexpr, ACC16: tl.constexpr):
        rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        acc = tl.full((BLOCK, BLOCK), 0, tl.float16 if ACC16 else tl.float32)
        for k0 in range(0, K, BLOCK):
            ks = k0 + tl.arange(0, BLOCK)
            a = tl.load(a_ptr + rows[:, None] * K + ks[None, :])
            b = tl.load(b_ptr + ks[:, None] * N + cols[None, :])
            acc = tl.dot(a, b, acc, input_precision=PRECISION, out_dtype=acc.dtype)
        tl.store(c_ptr + rows[:, None] * N + cols[None, :], acc.to(tl.float32))

    @decorate
    def cast_probe(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + i, mask=i < n)
        tl.store(y_ptr + i, x.to(y_ptr.dtype.element_ty), mask=i < n)

    @decorate
    def math_probe(x_ptr, y_ptr, n, OP: tl.constexpr, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        x = tl.load(x_ptr + i, mask=i < n)
        if OP == "log2":
            y = tl.log2(x)
        elif OP == "exp2":
            y = tl.exp2(x)
        elif OP == "sqrt":
            y = tl.sqrt(x)
        elif OP == "mul":
            y = x * 1024.0
        elif OP == "div":
            y = x / 0.5
        else:
            y = x + x
        tl.store(y_ptr + i, y, mask=i < n)

    return dot_probe, cast_probe, math_probe


_POWERS = [2.0 ** -149, 2.0 ** -140, 2.0 ** -130, 2.0 ** -127, 2.0 ** -126, 2.0 ** -100, 0.5, 0.0]
MATH_INPUTS = {  # op -> fp32 inputs whose exact results are fp32 values (subnormal inputs or results)
    "log2": _POWERS, "sqrt": [2.0 ** -148, 2.0 ** -140, 2.0 ** -130, 2.0 ** -128, 2.0 ** -126, 2.0 ** -100, 0.25, 0.0],
    "exp2": [-149.0, -140.0, -130.0, -127.0, -126.0, -100.0, -1.0, 0.0],
    **{op: _POWERS + [3 * 2.0 ** -140] for op in ("mul", "div", "add")}}
"""``math_specials/<op>``: whether a GPU flushes subnormal fp32 inputs or results to zero, op by op (powers of
two, so that every unflushed result is exact whatever the instruction's approximation)."""


def math_probes(math_probe, device):
    results = {}
    for op, values in MATH_INPUTS.items():
        x = torch.tensor(values, dtype=torch.float32)
        y = torch.empty_like(x, device=device)
        math_probe[(1, )](x.to(device), y, x.numel(), op, 16)
        results[f"math_specials/{op}"] = {"inputs": values,
                                          "bits": [int(v) & 0xFFFFFFFF for v in y.cpu().view(torch.int32)]}
    return results


def digest(t: torch.Tensor) -> str:
    """sha256 of the tensor's bytes (first 16 hex digits): equal digests = bitwise equal outputs."""
    raw = t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()
    return hashlib.sha256(raw).hexdigest()[:16]


def dot_operands(dtype: str, inputs: str):
    """A [M, K], B [K, N] in ``dtype``: standard normal, or "wide" (times 2**j, j uniform integer)."""
    g = torch.Generator().manual_seed(1)
    low, high = (-9, 2) if dtype.startswith("fp8") else (-6, 6)

    def draw(*shape):
        x = torch.randn(*shape, generator=g)
        if inputs == "wide":
            x = x * torch.exp2(torch.randint(low, high + 1, shape, generator=g).float())
        return x.to(DTYPES[dtype])

    return draw(M, K), draw(K, N)


def dot_probes(dot_probe, device):
    results = {}
    for name, (dtype, mode, acc16) in DOT_PROBES.items():
        for inputs in ("normal", "wide"):
            if acc16 and inputs == "wide":
                continue
            a, b = dot_operands(dtype, inputs)
            c = torch.empty(M, N, device=device)
            try:
                dot_probe[(M // BLOCK, N // BLOCK)](a.to(device), b.to(device), c, M, N, K, BLOCK, mode, acc16)
            except Exception as error:  # the stock interpreter refuses "bf16x3": a result, not a crash
                results[f"dot/{name}/{inputs}"] = {"error": repr(error)[:200]}
                continue
            truth = a.double() @ b.double()
            results[f"dot/{name}/{inputs}"] = {"rel_rms": rel_rms(c, truth, 1e-30), "digest": digest(c)}
    return results


def all_values(dtype) -> torch.Tensor:
    """Every code of an 8- or 16-bit float dtype, decoded to float64."""
    codes = torch.arange(2 ** (8 * dtype.itemsize), dtype=torch.int32)
    return codes.to(torch.int16 if dtype.itemsize == 2 else torch.uint8).view(dtype).double()


def cast_inputs(dtype, n=100_000):
    """fp32 inputs for a cast to ``dtype``: half log-uniform magnitudes from half the smallest
    subnormal to the largest finite value, half exact ties between neighbouring values; random signs."""
    g = torch.Generator().manual_seed(2)
    grid = all_values(dtype)
    grid = grid[torch.isfinite(grid) & (grid >= 0)].unique()
    spread = torch.exp2(torch.empty(n // 2, dtype=torch.float64).uniform_(
        math.log2(grid[1]) - 1, math.log2(grid[-1]), generator=g))
    ties = ((grid[:-1] + grid[1:]) / 2)[torch.randint(0, grid.numel() - 1, (n - n // 2, ), generator=g)]
    sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0)
    return (torch.cat([spread, ties]) * sign).float()


def cast_probes(cast_probe, device):
    results = {}
    for name in ("bf16", "fp16", "fp8e4m3", "fp8e5m2"):
        dtype = DTYPES[name]
        width = torch.uint8 if dtype.itemsize == 1 else torch.int16
        largest = torch.finfo(dtype).max
        x = cast_inputs(dtype)
        y = torch.empty(x.shape, dtype=dtype, device=device)
        cast_probe[(-(-x.numel() // 1024), )](x.to(device), y, x.numel(), 1024)
        expected = x.clamp(-largest, largest).to(dtype) if dtype.itemsize == 1 else x.to(dtype)
        results[f"cast/{name}"] = {
            "rel_rms": rel_rms(y.float(), x.double(), 1e-30),
            "torch_mismatches": int((y.cpu().view(width) != expected.view(width)).sum()),
            "digest": digest(y)}
        tiny = float(all_values(dtype)[1])
        specials = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, largest * 1.04, -largest * 1.04,
                                 largest * 3, 3.0e38, tiny / 4, tiny / 2, -tiny / 2, 0.75 * tiny])
        out = torch.empty(specials.shape, dtype=dtype, device=device)
        cast_probe[(1, )](specials.to(device), out, specials.numel(), 16)
        results[f"cast_specials/{name}"] = {"inputs": [float(v) for v in specials],
                                            "bits": [int(v) & 0xFFFF for v in out.cpu().view(width)]}
    return results


def skip_kda(reason: str) -> dict:
    print(f"kda rows skipped: {reason}")
    return {"kda": {"skipped": reason}}


def kda_probes(device):
    """optimized.kda against references.kda (float64) on one small problem per dtype and mode."""
    try:
        from refcheck.optimized import kda
        from refcheck.references import kda as reference
    except ImportError as error:
        return skip_kda(str(error))
    if not callable(kda):
        return skip_kda(f"optimized.kda is {type(kda).__name__}, not the op's function")
    modes = ("ieee", "tf32", "tf32x3") if "precision" in inspect.signature(kda).parameters else (None, )
    results = {}
    for name in ("fp32", "bf16"):
        g = torch.Generator().manual_seed(3)
        B, T, H, D = 1, 128, 2, 64
        q, k, v = (torch.randn(B, T, H, D, generator=g) for _ in range(3))
        gate = torch.nn.functional.logsigmoid(torch.randn(B, T, H, D, generator=g)) / 16
        beta = torch.sigmoid(torch.randn(B, T, H, generator=g))
        inputs = [x.to(DTYPES[name]) for x in (q, k, v, gate, beta)]
        truth, _ = reference(*(x.double() for x in inputs), use_qk_l2norm=True)
        for mode in modes if name == "fp32" else (None, ):
            knobs = {} if mode is None else {"precision": mode}
            key = f"kda/{name}/{mode or 'default'}"
            try:
                o, _ = kda(*(x.to(device) for x in inputs), use_qk_l2norm=True, **knobs)
                results[key] = {"rel_rms": rel_rms(o, truth, 1e-30), "digest": digest(o)}
            except Exception as error:  # a broken kernel is a result of the calibration, not a crash
                print(f"{key} failed: {error!r}")
                results[key] = {"error": repr(error)}
    return results


def measure(device: str, stock: bool) -> dict:
    if device == "cpu":
        from refcheck.runtime import interpreter
        interpreter.interpret_new_kernels()
        if not stock:
            interpreter.enable()
    dot_probe, cast_probe, math_probe = define_kernels()
    probes = {**dot_probes(dot_probe, device), **cast_probes(cast_probe, device), **math_probes(math_probe, device),
              **kda_probes(device)}
    environment = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                   "torch": torch.__version__, "triton": triton.__version__,
                   "interpreted": device == "cpu", "faithful": device == "cpu" and not stock}
    return {"environment": environment, "probes": probes}


def describe(entry: dict) -> str:
    if "rel_rms" in entry:
        extra = f", {entry['torch_mismatches']} mismatches vs torch" if "torch_mismatches" in entry else ""
        return f"{entry['rel_rms']:.3g}{extra}"
    if "bits" in entry:
        return " ".join(f"{b:x}" for b in entry["bits"])
    return entry.get("skipped") or entry.get("error", "?")


def compare(gpu: dict, cpu: dict) -> int:
    """Print the side-by-side Markdown table; return the number of flagged rows."""
    print(f"GPU: {gpu['environment']}\nCPU: {cpu['environment']}\n")
    print("| probe | GPU | CPU | ratio CPU/GPU | bitwise | flag |\n| --- | --- | --- | --- | --- | --- |")
    flagged = 0
    for key in sorted(set(gpu["probes"]) | set(cpu["probes"])):
        g, c = gpu["probes"].get(key, {"error": "missing"}), cpu["probes"].get(key, {"error": "missing"})
        ratio, flag = "", ""
        if "rel_rms" in g and "rel_rms" in c:
            r = 1.0 if g["rel_rms"] == c["rel_rms"] else (c["rel_rms"] / g["rel_rms"] if g["rel_rms"] else math.inf)
            ratio = f"{r:.3g}"
            flag = "" if 1 / RATIO_LIMIT <= r <= RATIO_LIMIT else "OUT"
        elif "bits" in g and "bits" in c:
            flag = "" if g["bits"] == c["bits"] else "DIFF"
        elif not ("skipped" in g and "skipped" in c):
            flag = "MISSING"
        same = ""
        for field in ("digest", "bits"):
            if field in g and field in c:
                same = "yes" if g[field] == c[field] else "no"
        flagged += bool(flag)
        print(f"| {key} | {describe(g)} | {describe(c)} | {ratio} | {same} | {flag} |")
    print(f"\n{flagged} row(s) flagged (ratio outside [1/{RATIO_LIMIT}, {RATIO_LIMIT}], differing bits, missing)")
    return flagged


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None,
                        help="default: cuda when torch sees one, else cpu (interpreted)")
    parser.add_argument("--stock", action="store_true", help="cpu only: leave the interpreter stock")
    parser.add_argument("--out", type=Path, help="write the measurements to this JSON file")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("GPU_JSON", "CPU_JSON"))
    args = parser.parse_args(argv)
    if args.compare:
        gpu, cpu = (json.loads(p.read_text()) for p in args.compare)
        return 1 if compare(gpu, cpu) else 0
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.stock and device != "cpu":
        parser.error("--stock: only for the interpreted (cpu) run")
    record = measure(device, args.stock)
    for key, entry in record["probes"].items():
        print(f"{key:28s} {describe(entry)}")
    if args.out:
        args.out.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
