"""Gated DeltaNet's forward front: q and k normalized once per query/key head, the serial pass's row scales once per
value head.

With one decay per head and token, KDA's prepared operands (``chunk.prepared``: ``k e^G``, ``k e^{G_last - G}``,
``q e^G``) are q and k themselves under row scales: ``Kg = Diag(e^G) k``, ``Kd = Diag(e^{G_last - G}) k``,
``Qg = Diag(e^G) q``, G the chunk-local cumulative gate ``[T, HV]``. So nothing ``[T, HV, K]`` is formed: one program
per chunk, query/key head and column block stores qn and kn (``use_qk_l2norm``; else q and k are read as given), and
the first column block's program stores, for each value head of its group, the scales ``e^G`` and ``e^{G_last - G}``
(``[T, HV, 1]`` fp32), which the serial pass and the output read beside q and k at their query/key head
(``kda.chunk_fwd.recurrence_kernel``'s ``GROUP``).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..chunk.prepared import SCALE_BLOCK, PreparedKeys
from ..chunk.state import state_blocks
from ..chunk.tiles import chunk_rows, decay, row_offsets
from ..common import Chunks, launch
from ..kda.front import FRONT_LAUNCH, normalized
from ..kda.l2norm import EPS


@triton.jit
def scalar_front_kernel(q_ptr, k_ptr, G_ptr, qn_ptr, kn_ptr, eg_ptr, ed_ptr, cu_ptr, seq_ptr, start_ptr, eps, HK, H,
                        K, C: tl.constexpr, KB: tl.constexpr, NKB: tl.constexpr, L2NORM: tl.constexpr):
    """One chunk, query/key head hk and column block: with ``L2NORM`` qn and kn; in the first column block, for the
    value heads ``hk * H / HK + j`` of its group, ``e^G`` and ``e^{G_last - G}`` of every row (module docstring)."""
    c = tl.program_id(0)
    t0, n, i, rows, rmask, grows = chunk_rows(c, cu_ptr, seq_ptr, start_ptr, C)
    hk = tl.program_id(1)
    kb = tl.program_id(2)
    if L2NORM:
        cols = kb * KB + tl.arange(0, KB)
        cmask = cols < K
        normalized(k_ptr, kn_ptr, rows, rmask, hk, HK, K, cols, cmask, eps, KB, NKB, True)
        normalized(q_ptr, qn_ptr, rows, rmask, hk, HK, K, cols, cmask, eps, KB, NKB, True)
    if kb == 0:
        group = H // HK
        for j in range(group):
            h = hk * group + j
            G = tl.load(G_ptr + row_offsets(grows, h, H, 1), mask=grows >= 0, other=0.0)
            G_last = tl.load(G_ptr + (t0 + n - 1).to(tl.int64) * H + h)
            tl.store(eg_ptr + row_offsets(rows, h, H, 1), decay(G), mask=rmask)
            tl.store(ed_ptr + row_offsets(rows, h, H, 1), decay(G_last - G), mask=rmask)


def scalar_front(q, k, G, l2norm: bool, chunks: Chunks, config: dict | None = None):
    """``(qn, kn, keys)`` from tokens-flattened q and k ``[T, HK, K]`` and the cumulative gate ``G [T, HV]`` (HV a
    multiple of HK): q and k as the forward's kernels read them (normalized with ``l2norm``, else as given, not
    copied) and the serial pass's ``PreparedKeys``, q and k under the row scales ``e^G`` and ``e^{G_last - G}``."""
    total, HK, K = k.shape
    H = G.shape[1]
    qn, kn = (torch.empty_like(q), torch.empty_like(k)) if l2norm else (q, k)
    eg = torch.empty(total, H, 1, device=k.device, dtype=torch.float32)
    ed = torch.empty_like(eg)
    KB, NKB = state_blocks(K, maximum=SCALE_BLOCK)
    if chunks.num_chunks and H:
        launch(scalar_front_kernel, (chunks.num_chunks, HK, NKB if l2norm else 1),
               (q, k, G, qn, kn, eg, ed, chunks.cu, chunks.seq, chunks.start, EPS, HK, H, K),
               dict(C=chunks.size, KB=KB, NKB=NKB, L2NORM=l2norm), [FRONT_LAUNCH | (config or {})])
    return qn, kn, PreparedKeys(kn, eg, kn, ed, qn, eg)
