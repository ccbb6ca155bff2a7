"""Long sequences cut into segments that a serial pass runs side by side.

A serial pass (``chunk.state``) walks the chunks of each sequence in order, one program per (value
block, sequence, head): a long single sequence gives it few programs, each a long chain of dependent
steps (B=1, T=32768, H=16: 512 steps for 32 programs of 64 values, for 132 SMs). Where the pass is
linear in its state, it can run a sequence in segments of chunks side by side instead.

KDA's forward pass maps the entry state ``S [K, V]`` of a chunk to its exit state affinely,
``S' = A S + B`` (``A = Diag(gamma) - Kd^T T Diag(beta) Kg`` ``[K, K]``, ``B = Kd^T T Diag(beta) V``);
its reverse pass maps the gradient of the exit state back the same way, with ``A^T``. Over a segment the
map stays affine, ``S_end = M S_start + E``, and one run of the unchanged pass gives both parts: started
from the state ``[0 | I]`` with K more value columns, whose values are zero, its first V columns end at
E and its last K at M. So a pass over segments is three steps:

 1. every segment from ``[0 | I]``, side by side, its states ``[K, V + K]`` kept only at its end
    (``run``);
 2. the scan along each sequence's segments: ``S_{j+1} = M_j S_j + E_j`` (``scan``, one launch; backwards for
    the reverse pass);
 3. every segment again from its entry state ``S_j``, side by side, storing what the pass stores.

Step 1 does ``1 + K / V`` times the work of step 3 and step 3 as much as the unsplit pass: the split
pays where the unsplit pass leaves SMs idle (``segment_length``). The sequence's last state (the forward's
final state, the reverse pass's gradient of the initial state) comes out of the scan.

The backward reuses what the forward's steps 1 and 2 found (``Transitions``: each segment's M and entry
state, ``[NS, H, K, K]`` and ``[NS, H, K, V]``, a few MB): its recomputation of the forward pass is step 3
alone, and its reverse pass, whose segment maps are the forward's transposed (``M^T``: the chunk maps'
product in reverse order, each transposed), runs step 1 on the V value columns only, from zero. Measured on
an H100 (bf16, B=1, T=32768, H=16, K=V=128, ``benchmarks/kda.py --profile``): the recomputation 2.00 -> 0.94 ms
with its operands, the reverse pass 3.14 -> 2.31 (at 71b3991).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ..common import Chunks, padded
from .state import SMS

MIN_SEGMENT = 16
"""The fewest chunks a segment has when the length is chosen from the shape (``segment_length``): the
three launches and the scan's matmuls are fixed costs that only a long chain of steps pays for."""


def check_segment_chunks(segment_chunks) -> int | None:
    """The ``segment_chunks`` knob of a chunked op's API as given: None (the plan chooses) or an int >= 0 (0: never
    split), else a ValueError naming it."""
    if segment_chunks is not None and (isinstance(segment_chunks, bool) or not isinstance(segment_chunks, int)
                                       or segment_chunks < 0):
        raise ValueError(f"segment_chunks: expected None or an int >= 0, got {segment_chunks!r}")
    return segment_chunks


def segment_length(chunks: Chunks, H: int, V: int) -> int:
    """Chunks per segment for a serial pass over ``chunks`` with H heads and V values, or 0 (no split).

    The unsplit pass has ``N H ceil(V / 64)`` programs of 64 values (N sequences); an H100/H200 runs two
    of them an SM at once (``chunk.state.serial_launch``), so ``slots = 2 SMS / (H ceil(V / 64))``
    sequences of segments fill it. Split where the sequences are at most a quarter of the slots (step 1 is
    twice the unsplit pass's work at K = V, so the GPU must be that empty for the split to pay), into
    segments of ``ceil(total chunks / slots)`` chunks, at least ``MIN_SEGMENT``."""
    slots = 2 * SMS // (H * triton.cdiv(V, 64))
    if not chunks.counts or slots < 4 * chunks.num_seqs:
        return 0
    length = max(MIN_SEGMENT, triton.cdiv(sum(chunks.counts), slots))
    return length if max(chunks.counts) > length else 0


PLANS_KEPT = 8
"""How many segment plans ``plan`` keeps (by chunk table and length)."""
_plans: list[tuple] = []


def plan(chunks: Chunks, H: int, V: int, segment_chunks: int | None) -> Segments | None:
    """The segments of a pass with H heads and V values: of ``segment_chunks`` chunks (0: none; None:
    ``segment_length``), or None where no sequence is longer than one segment. The latest ``PLANS_KEPT`` are
    kept, by chunk table (``common.make_chunks`` keeps those) and length: ``split`` takes a dozen small kernels,
    whose queueing the host pays on every call (every layer of a model asks for the same plan)."""
    length = segment_length(chunks, H, V) if segment_chunks is None else segment_chunks
    if not (length and max(chunks.counts, default=0) > length):
        return None
    for cached, cached_length, segments in _plans:
        if cached is chunks and cached_length == length:
            return segments
    segments = split(chunks, length)
    _plans.append((chunks, length, segments))
    del _plans[:-PLANS_KEPT]
    return segments


@dataclass(frozen=True)
class Segments:
    """Every sequence of ``chunks`` cut into segments of at most ``length`` chunks.

    chunks:  the segments as sequences (``Chunks``: their token spans and first chunks; the chunks keep
             their indices, so a pass over the segments stores per-chunk results where the unsplit pass does)
    table:   int64 ``[N, m]``, the segment index of sequence n's j-th segment, or ``NS`` (one past the last
             segment) where the sequence has fewer than ``m`` segments
    """

    chunks: Chunks
    table: torch.Tensor


def split(chunks: Chunks, length: int) -> Segments:
    """``chunks``' sequences in segments of ``length`` chunks (the last of each possibly shorter). Built on
    the chunks' device from sizes known on the host: no copy from the host, which would wait for the GPU."""
    per_seq = [triton.cdiv(n, length) for n in chunks.counts]
    N, m, NS, dev = len(per_seq), max(per_seq, default=0), sum(per_seq), chunks.cu.device
    cu, off = chunks.cu.long(), chunks.offsets.long()
    segs = (off[1:] - off[:-1] + length - 1) // length
    owner = torch.repeat_interleave(torch.arange(N, device=dev), segs, output_size=NS)
    j = torch.arange(NS, device=dev) - (segs.cumsum(0) - segs)[owner]  # the segment's index in its sequence
    seg_cu = torch.cat([cu[owner] + j * (length * chunks.size), cu[-1:]])
    seg_off = torch.cat([off[owner] + j * length, off[-1:]])
    seq = torch.repeat_interleave(torch.arange(NS, device=dev), seg_off[1:] - seg_off[:-1], output_size=chunks.num_chunks)
    table = torch.full((N, m), NS, dtype=torch.int64, device=dev)
    table[owner, j] = torch.arange(NS, device=dev)
    counts = tuple(min(length, n - i * length) for n, s in zip(chunks.counts, per_seq) for i in range(s))
    i32 = torch.int32
    return Segments(Chunks(seg_cu.to(i32), seq.to(i32), chunks.start, seg_off.to(i32), chunks.size, chunks.tokens,
                           counts), table)


class Transitions(NamedTuple):
    """What a forward pass over segments leaves for the backward: each segment's map ``M [NS, H, K, K]``
    (``S_end = M S_start + E``) and the state it starts from, ``entries [NS, H, K, V]`` (fp32)."""

    M: torch.Tensor
    entries: torch.Tensor


def run(walk, segments: Segments, first: torch.Tensor | None, H: int, K: int, V: int,
        maps: torch.Tensor | None = None, reverse: bool = False) -> tuple[torch.Tensor, Transitions]:
    """A serial pass over ``segments`` in the three steps (module docstring); returns the last state of every
    sequence (``scan``) and the segments' ``Transitions``. ``walk(chunks, start, W, steps)`` launches the pass
    over ``chunks`` from the states ``start [NS, H, K, W]`` (None: zero), with its per-chunk stores where
    ``steps``, and returns every segment's end state ``[NS, H, K, W]`` where not ``steps``. ``maps``: the
    segments' maps ``[NS, H, K, K]`` where known (the reverse pass: the forward's, transposed), so that step 1
    runs the V value columns alone, from zero."""
    if maps is None:
        start = torch.zeros(segments.chunks.num_seqs, H, K, V + K, device=segments.table.device, dtype=torch.float32)
        start[..., V:] = torch.eye(K, device=start.device, dtype=torch.float32)
        ends = walk(segments.chunks, start, V + K, False)
        E, maps = ends[..., :V], ends[..., V:]
    else:
        E = walk(segments.chunks, None, V, False)
    entries, last = scan(E, maps, first, segments, reverse)
    walk(segments.chunks, entries, V, True)
    return last, Transitions(maps, entries)


@triton.jit
def copy_state(dst, src, K, V, vv, vmask, W: tl.constexpr, BV: tl.constexpr, HAS_SRC: tl.constexpr):
    """``dst = src`` (zero without ``HAS_SRC``) on the value block ``vv`` of ``[K, V]`` row-major states."""
    rr = tl.arange(0, W)
    for r0 in range(0, K, W):
        rows = r0 + rr
        at = rows[:, None] * V + vv[None, :]
        mask = (rows < K)[:, None] & vmask[None, :]
        x = tl.zeros((W, BV), tl.float32)
        if HAS_SRC:
            x = tl.load(src + at, mask=mask, other=0.0).to(tl.float32)
        tl.store(dst + at, x, mask=mask)


@triton.jit
def affine_state(dst, src, M, E, K, V, sM_r, sM_c, sE_r, vv, vmask, W: tl.constexpr, BV: tl.constexpr):
    """``dst = M src + E`` on the value block ``vv``: ``M [K, K]`` (row and column strides), ``E [K, *]`` (row
    stride), src and dst ``[K, V]`` row-major, by ``[W, W]`` blocks of M at fp32 ("ieee"). src is read from memory
    (another thread of the program wrote it): a state of K = 256 rows does not fit in registers beside its map."""
    rr = tl.arange(0, W)
    for r0 in range(0, K, W):
        rows = r0 + rr
        rmask = rows < K
        acc = tl.load(E + rows[:, None] * sE_r + vv[None, :], mask=rmask[:, None] & vmask[None, :], other=0.0)
        for c0 in range(0, K, W):
            cols = c0 + rr
            cmask = cols < K
            Mb = tl.load(M + rows[:, None] * sM_r + cols[None, :] * sM_c, mask=rmask[:, None] & cmask[None, :],
                         other=0.0)
            Sb = tl.load(src + cols[:, None] * V + vv[None, :], mask=cmask[:, None] & vmask[None, :], other=0.0,
                         cache_modifier=".cg")
            acc += tl.dot(Mb, Sb, input_precision="ieee")
        tl.store(dst + rows[:, None] * V + vv[None, :], acc, mask=rmask[:, None] & vmask[None, :])


@triton.jit
def scan_kernel(E_ptr, M_ptr, first_ptr, table_ptr, entries_ptr, last_ptr, H, K, V, NS, m, sE_s, sE_h, sE_r, sM_s,
                sM_h, sM_r, sM_c, W: tl.constexpr, BV: tl.constexpr, HAS_FIRST: tl.constexpr, REVERSE: tl.constexpr):
    """One value block, sequence and head of ``scan``: each segment's entry state written as it is reached (the
    first from ``first``, or zero), the next one from it, then the sequence's last state."""
    nh = tl.program_id(1)
    n = nh // H
    h = nh % H
    vv = tl.program_id(0) * BV + tl.arange(0, BV)
    vmask = vv < V
    size = K * V
    first = first_ptr + nh.to(tl.int64) * size
    prev = tl.zeros((), tl.int64) - 1
    for jj in range(m):
        if REVERSE:
            j = m - 1 - jj
        else:
            j = jj
        seg = tl.load(table_ptr + n.to(tl.int64) * m + j)
        if seg < NS:
            dst = entries_ptr + (seg * H + h) * size
            if prev < 0:
                copy_state(dst, first, K, V, vv, vmask, W, BV, HAS_FIRST)
            else:
                affine_state(dst, entries_ptr + (prev * H + h) * size, M_ptr + prev * sM_s + h * sM_h,
                             E_ptr + prev * sE_s + h * sE_h, K, V, sM_r, sM_c, sE_r, vv, vmask, W, BV)
            tl.debug_barrier()  # dst is the next step's src, read by the program's other threads
            prev = seg
    last = last_ptr + nh.to(tl.int64) * size
    if prev < 0:
        copy_state(last, first, K, V, vv, vmask, W, BV, HAS_FIRST)
    else:
        affine_state(last, entries_ptr + (prev * H + h) * size, M_ptr + prev * sM_s + h * sM_h,
                     E_ptr + prev * sE_s + h * sE_h, K, V, sM_r, sM_c, sE_r, vv, vmask, W, BV)


def scan(E: torch.Tensor, M: torch.Tensor, first: torch.Tensor | None, segments: Segments, reverse: bool = False):
    """Step 2: the entry state of every segment and the last state of every sequence, in one launch.

    ``E [NS, H, K, V]``, ``M [NS, H, K, K]`` (any strides, E's last one 1): every segment's map ``S_end = M S_start +
    E``; ``first [N, H, K, V]``: the state each sequence starts from (the initial state; the gradient of the final
    state for ``reverse``), or None (zero). Forward, ``S_0 = first``, ``S_{j+1} = M_j S_j + E_j``; ``reverse`` walks
    the segments last to first. Returns ``(entries [NS, H, K, V], last [N, H, K, V])``, fp32: ``entries[s]`` the
    state segment s starts from (for ``reverse`` the one its last chunk ends with), ``last`` the state after every
    segment of each sequence. One program per (value block, sequence, head) walks the sequence's segments: as a
    loop of torch calls (an index, a copy and a batched matmul per segment) the host took longer to queue them than
    the GPU to run them (H100, B=1, T=32768, H=16, K=V=128: the forward's host time 3.7 ms, its kernels 3.2)."""
    NS, H, K, V = E.shape
    N, m = segments.table.shape
    entries = torch.empty(NS, H, K, V, device=E.device, dtype=torch.float32)
    last = torch.empty(N, H, K, V, device=E.device, dtype=torch.float32)
    assert E.stride(-1) == 1, "E's rows must be contiguous"
    first = None if first is None else first.float().contiguous()
    # value blocks of 16: one program per (block, sequence, head) does the whole chain, so the programs are
    # few (B=1, H=16, V=128: 128 of them); at 64 values the launch took 0.128 ms on an H200 (B=1, T=32768, K=V=128)
    W, BV = min(padded(K), 64), 16
    scan_kernel[(triton.cdiv(V, BV), N * H)](
        E, M, E if first is None else first, segments.table, entries, last, H, K, V, NS, m, *E.stride()[:3],
        *M.stride(), W=W, BV=BV, HAS_FIRST=first is not None, REVERSE=reverse)
    return entries, last
