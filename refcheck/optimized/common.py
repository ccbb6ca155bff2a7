"""Helpers every Triton op family shares: precision modes, padded tile sizes, packed-sequence chunks.

Nothing here launches a kernel; these functions turn the public arguments into the scalars and small
index tensors that kernels take.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from refcheck.references.contract import check_cu_seqlens, check_state

PRECISIONS = ("ieee", "tf32", "tf32x3")


class SideStream:
    """Launches enqueued on a second CUDA stream, beside those of the current one: inside ``with side:`` (after all
    the current stream has enqueued before), so that independent kernels after the block, on the current stream, run
    at the same time; ``join(*outputs)`` makes the current stream wait for the block's launches and marks its outputs
    (tensors, or tuples of them) as used by the current stream (``Tensor.record_stream``: the caching allocator then
    does not give their memory to the side stream while the current one reads them). Kernels that are each bound by
    something else (latency and memory) then share the SMs; on the CPU, whose interpreted kernels run one after
    another, both are no-ops."""

    _streams: dict[tuple[torch.device, int], torch.cuda.Stream] = {}

    def __init__(self, device: torch.device, lane: int = 0):
        """``lane``: which of the device's side streams (each a stream of its own, made once)."""
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.main = torch.cuda.current_stream(device)
            if (device, lane) not in SideStream._streams:
                SideStream._streams[device, lane] = torch.cuda.Stream(device)
            self.side = SideStream._streams[device, lane]

    def __enter__(self) -> SideStream:
        if self.cuda:
            self.side.wait_stream(self.main)
            self.context = torch.cuda.stream(self.side)
            self.context.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.cuda:
            self.context.__exit__(*exc)

    def join(self, *outputs) -> None:
        def record(x) -> None:
            if isinstance(x, torch.Tensor):
                x.record_stream(self.main)
            elif isinstance(x, tuple):
                for y in x:
                    record(y)
        if self.cuda:
            self.main.wait_stream(self.side)
            record(outputs)


def check_precision(precision) -> str:
    """The ``input_precision`` of the fp32 ``tl.dot`` calls: one of ``PRECISIONS``.

    "ieee" is exact fp32 (FMA units on Hopper, slow), "tf32" rounds each operand to 10 mantissa
    bits (tensor cores, fast), "tf32x3" splits each operand into two tf32 halves and sums three
    tensor-core products (about fp32 accuracy at roughly a third of tf32 speed).
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision: expected one of {PRECISIONS}, got {precision!r}")
    return precision


def check_runs_on(name: str, x: torch.Tensor, kernel) -> None:
    """That ``kernel`` can run on the device of argument ``name``: CUDA, or the CPU where Triton kernels are
    interpreted (``TRITON_INTERPRET=1`` before the first ``import triton``, as
    ``refcheck.runtime.backend.configure_backend("cpu")`` sets it). There refcheck's faithful interpreter is
    switched on first: the stock one computes bf16 and fp16 dots wrongly (o off by 1e9 measured)."""
    from refcheck.runtime import interpreter
    if x.device.type == "cuda":
        return
    if x.device.type == "cpu" and interpreter.is_interpreted(kernel):
        interpreter.enable()
        return
    raise ValueError(f"{name}: a tensor on {x.device}; refcheck's Triton kernels run on CUDA tensors, or on the CPU "
                     "through Triton's interpreter: call refcheck.runtime.backend.configure_backend('cpu') before "
                     "importing refcheck.optimized")


def check_flag(name: str, value) -> bool:
    """A boolean keyword; anything else (including 0/1) is a ValueError naming ``name``."""
    if not isinstance(value, bool):
        raise ValueError(f"{name}: expected True or False, got {value!r}")
    return value


LOG2E = 1.4426950408889634
"""log2(e): the kernels work in base 2, ``exp(x) = exp2(x * LOG2E)``."""
KERNEL_LOG2E = tl.constexpr(LOG2E)
"""The same inside kernels (compiled, a kernel reads only constexpr globals)."""


def padded(n: int, minimum: int = 16) -> int:
    """The tile width for a head dimension ``n``: the next power of two, at least ``minimum``
    (``tl.dot`` needs 16). Loads past ``n`` are masked to zero."""
    return max(minimum, triton.next_power_of_2(n))


def column_tiles(d: int) -> tuple[int, int]:
    """``(B1, B2)``: a head dimension ``d`` as two column tiles ``[0, B1)`` and ``[B1, B1 + B2)`` (B2 = 0:
    one), powers of two whose sum pads ``d`` less than one tile would (MLA's 192 = 128 + 64, not 256; its
    absorbed 576 = 512 + 64, not 1024); a dot over ``d`` is then two dots into one accumulator."""
    full = padded(d)
    first = full // 2
    rest = padded(d - first) if d > first else 0
    return (first, rest) if 0 < rest and first + rest < full else (full, 0)


@dataclass(frozen=True)
class Chunks:
    """The fixed-size chunks of a packed batch of sequences.

    Every sequence n spans tokens ``[cu[n], cu[n+1])`` of the flattened ``[B*T]`` token axis and is
    cut into ``ceil(len / size)`` chunks, the last one possibly partial (empty sequences have none).

    cu:      int32 ``[N+1]`` sequence boundaries on the tokens' device
    seq:     int32 ``[NC]`` the sequence of each chunk
    start:   int32 ``[NC]`` the first token of each chunk
    offsets: int32 ``[N+1]`` index of each sequence's first chunk (``offsets[-1] == NC``)
    tokens:  the length ``B*T`` of the flattened token axis (``cu[-1] <= tokens``), known on the host:
             buffers over the tokens take it, not ``cu[-1]``, whose read would wait for the GPU
    counts:  the number of chunks of every sequence, on the host (launch plans that depend on the
             sequences' lengths read it, not ``offsets``)
    """

    cu: torch.Tensor
    seq: torch.Tensor
    start: torch.Tensor
    offsets: torch.Tensor
    size: int
    tokens: int
    counts: tuple[int, ...]

    @property
    def num_seqs(self) -> int:
        return self.cu.numel() - 1

    @property
    def num_chunks(self) -> int:
        return self.seq.numel()


@dataclass(frozen=True)
class Selection:
    """Some sequences of a ``Chunks`` and their chunks, as int32 indices on the tokens' device: ``seqs`` (into its
    sequences) and ``chunks`` (into its chunks), for launches over a group of them (a serial pass's programs,
    ``chunk.state.serial_program``; the output's, ``chunk.output.output_kernel``)."""

    seqs: torch.Tensor
    chunks: torch.Tensor

    @property
    def num_seqs(self) -> int:
        return self.seqs.numel()

    @property
    def num_chunks(self) -> int:
        return self.chunks.numel()


TABLES_KEPT = 8
"""How many chunk tables ``make_chunks`` keeps (the latest shapes and ``cu_seqlens`` tensors)."""
_tables: list[tuple] = []


def make_chunks(batch: int, length: int, cu_seqlens: torch.Tensor | None, size: int,
                device: torch.device) -> Chunks:
    """Chunk table for ``B`` rows of ``T`` tokens (``cu_seqlens is None``: row b is the sequence
    ``[b*T, (b+1)*T)``) or for the packed sequences of ``cu_seqlens``, which it validates
    (``check_cu_seqlens``, a ValueError naming it).

    Every layer of a model asks for the same table, and building it takes a dozen small kernels;
    validating packed sequences also reads their bounds on the host, which waits for the GPU to finish
    what was queued, and the GPU then idles while the host queues the next kernels. So the latest
    ``TABLES_KEPT`` tables are kept, by shape, and for packed sequences by the ``cu_seqlens`` tensor
    itself, unchanged since (its version counter): a call with the same one reuses its table without
    reading anything back (H100, bf16, 8 packed sequences, T=32768, H=16, K=V=128: the forward 3.95 -> 3.07
    ms, forward+backward 14.30 -> 13.16, at 5b7929a)."""
    key = (batch, length, size, torch.device(device))
    version = None if cu_seqlens is None else cu_seqlens._version
    for cached, cached_version, cached_key, chunks in _tables:
        if cached is cu_seqlens and cached_version == version and cached_key == key:
            return chunks
    if cu_seqlens is not None:
        spans = check_cu_seqlens(cu_seqlens, batch, length)
        counts = tuple(triton.cdiv(e - s, size) for s, e in spans)
        cu = cu_seqlens.to(device=device, dtype=torch.int64)
    else:
        counts = (triton.cdiv(length, size),) * batch
        cu = torch.arange(batch + 1, device=device, dtype=torch.int64) * length
    per_seq = (cu[1:] - cu[:-1] + size - 1) // size
    offsets = torch.zeros_like(cu)
    offsets[1:] = torch.cumsum(per_seq, 0)
    total = sum(counts)
    seq = torch.repeat_interleave(torch.arange(per_seq.numel(), device=device), per_seq, output_size=total)
    start = cu[seq] + (torch.arange(total, device=device) - offsets[seq]) * size
    i32 = torch.int32
    chunks = Chunks(cu.to(i32), seq.to(i32), start.to(i32), offsets.to(i32), size, batch * length, counts)
    _tables.append((cu_seqlens, version, key, chunks))
    del _tables[:-TABLES_KEPT]
    return chunks


def launch(kernel, grid, args, constexprs: dict, ladder: list[dict]) -> dict:
    """Launch ``kernel[grid](*args, **constexprs, **step)`` with the first step of ``ladder`` (launch
    settings and block sizes, preferred first) that fits the GPU: a step whose shared memory exceeds
    the device's raises ``OutOfResources`` at launch, and the next one is tried. ``args``: a tuple, or
    a function of the step giving it (arguments that depend on block sizes, such as TMA descriptors); ``grid``
    likewise a function of the launch's settings where it depends on them. Returns the step that ran: what a
    caller sized by block sizes must be sized by (the interpreter, having no shared memory to run short of, runs the
    first step only)."""
    from triton.runtime.errors import OutOfResources
    for n, step in enumerate(ladder):
        try:
            kernel[grid](*(args(step) if callable(args) else args), **constexprs, **step)
            return step
        except OutOfResources:
            if n == len(ladder) - 1:
                raise
    raise ValueError("launch: an empty ladder")


def kernel_state(initial_state, n: int, h: int, k: int, v: int, device) -> torch.Tensor | None:
    """``initial_state`` ``[N, H, K, V]`` as the chunked kernels read it (fp32, contiguous, on the
    inputs' device), or None; a ValueError naming it otherwise."""
    if initial_state is None:
        return None
    check_state("initial_state", initial_state, n, h, k, v)
    if initial_state.dtype != torch.float32 or initial_state.device != device:
        raise ValueError(f"initial_state: expected float32 on {device}, got {initial_state.dtype} on "
                         f"{initial_state.device}")
    return initial_state.contiguous()


def tma_aligned(*xs: torch.Tensor) -> bool:
    """Whether TMA descriptors can address these tensors: not empty, the last dimension contiguous, 16-byte aligned
    base addresses and strides, and rows of a multiple of 16 bytes."""
    return all(x.numel() > 0 and x.stride(-1) == 1 and x.data_ptr() % 16 == 0
               and all(s * x.element_size() % 16 == 0 for s in x.stride()[:-1])
               and x.shape[-1] * x.element_size() % 16 == 0 for x in xs)


def tma_blocks(x: torch.Tensor, box: list[int]):
    """A TMA descriptor of x (``tma_aligned``) by blocks of shape ``box``; what lies past x loads as zeros and stores
    nothing."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    return TensorDescriptor(x, list(x.shape), list(x.stride()), list(box))


def row_blocks(x: torch.Tensor, rows: int, width: int):
    """``tma_blocks`` of ``x[t0 : t0 + rows, h, c0 : c0 + width]`` of a ``[tokens, heads, D]`` tensor."""
    return tma_blocks(x, [rows, 1, width])


def use_tma(config: dict | None, *xs: torch.Tensor) -> bool:
    """Whether a kernel reads or writes xs through TMA descriptors: where every x allows one (``tma_aligned``) and its
    launch ``config`` does not say ``TMA=False``."""
    return bool((config or {}).get("TMA", True)) and tma_aligned(*xs)


def tma_operands(config: dict | None, *blocks: tuple) -> tuple[bool, list]:
    """``(TMA, xs)`` for a kernel that reads or writes each ``(x, box)`` of ``blocks`` by blocks of shape ``box``
    (``chunk.tiles.load_rows``: ``[C, 1, width]`` of a ``[T, H, D]`` tensor; ``chunk.state.load_state`` and
    ``store_state``: ``[1, KB, BV]`` of the per-chunk states' ``[NC * H, K, V]`` view): TMA descriptors
    (``tma_blocks``) where ``use_tma``, else the tensors."""
    tma = use_tma(config, *(x for x, _ in blocks))
    return tma, [tma_blocks(x, box) if tma else x for x, box in blocks]


def launch_only(config: dict | None) -> dict:
    """A launch ``config`` without ``TMA`` (``use_tma``): the settings the kernel takes."""
    return {n: v for n, v in (config or {}).items() if n != "TMA"}
