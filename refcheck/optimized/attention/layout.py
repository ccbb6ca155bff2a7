"""The scalars and sequence tables every attention kernel takes, built once per call."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..common import LOG2E, column_tiles, padded


@dataclass(frozen=True)
class Layout:
    """One attention call as the kernels see it.

    batch, length: B and T of q ``[B, T, H, Dqk]`` (the ``[B, H, T]`` layout of lse and delta)
    heads, group:  H query heads, G = H / Hk query heads per key head
    cu_q, cu_k:    int32 ``[N+1]`` sequence boundaries on the flattened query / key axes (batched:
                   ``b * T`` and ``b * S``)
    max_q, max_k:  the longest query / key span (the launch grids)
    dqk, dv:       head dims; ``qk_tiles`` and ``bdv`` the tile widths that cover them
    itemsize:      bytes per element of q, k, v (fp32 4, bf16/fp16 2, fp8 1): the block sizes follow it
    window:        ``(left, right)`` keys a query sees around its diagonal, None where unbounded, causal
                   folded in (right at most 0)
    softcap:       scores ``softcap tanh(s / softcap)``, or None
    batched:       sequence n is batch row n (no cu_seqlens); else everything is batch row 0
    """

    batch: int
    length: int
    heads: int
    group: int
    cu_q: torch.Tensor
    cu_k: torch.Tensor
    max_q: int
    max_k: int
    dqk: int
    dv: int
    itemsize: int
    scale: float
    window: tuple[int | None, int | None]
    softcap: float | None
    precision: str
    batched: bool

    @property
    def mask_consts(self) -> dict:
        """The constexprs of the visibility mask and the scores (``tiles.visible``, ``forward.scores``)."""
        return dict(LEFT=self.window[0] is not None, RIGHT=self.window[1] is not None,
                    SOFTCAP=self.softcap is not None)

    def mask_args(self, factor: float = 1.0) -> tuple[float, int, int, float, float]:
        """``(qk_scale, left, right, cap_in, cap_out)``: the runtime scalars of the mask and the scores of
        ``q k^T`` times ``factor`` (fp8's descales) in base 2 (``forward.scores``)."""
        left, right = (0 if side is None else side for side in self.window)
        c = self.scale * factor
        if self.softcap is None:
            return c * LOG2E, left, right, 1.0, 1.0
        return 1.0, left, right, c / self.softcap, self.softcap * LOG2E

    @property
    def num_seqs(self) -> int:
        return self.cu_q.numel() - 1

    @property
    def qk_tiles(self) -> tuple[int, int]:
        """``(BQ1, BQ2)``: Dqk as two column tiles (``common.column_tiles``)."""
        return column_tiles(self.dqk)

    @property
    def bdv(self) -> int:
        return padded(self.dv)

    @property
    def width(self) -> int:
        """The head-dim tiles of q/k and v together (``sum(qk_tiles) + bdv``): MLA's 128 + 64 + 128 = 320."""
        return sum(self.qk_tiles) + self.bdv

    @property
    def wide(self) -> bool:
        """Whether a row of the tiles takes more than 512 bytes (fp32, or MLA in bf16): the kernels then
        walk smaller blocks, which the shared memory of a Hopper SM holds in three load stages."""
        return self.width * self.itemsize > 512

    def grid(self, length: int, block: int, heads: int) -> tuple[int, int, int] | None:
        """``(blocks of length, sequences, heads)``, or None when there is nothing to launch."""
        grid = (-(-length // block), self.num_seqs, heads)
        return grid if all(grid) else None

    def ladder(self, block: int, looped: int, width: int, inner: str = "BN") -> list[dict]:
        """Launch settings, preferred first (``common.launch`` falls back when shared memory runs
        out): deeper load pipelines first, then half the ``looped`` block (the constexpr ``inner``)
        that a program walks through while it keeps its own ``block`` rows and their fp32
        accumulators ``[block, width]``. Four warps while the scores and accumulators,
        ``block * (looped + width)`` fp32 values, stay within 96 a thread, else eight: the largest
        counts that compile without spills on sm_90 under Triton 3.6 (``kernel_resources.py``). On an
        H100 (``benchmarks/attention_sweep.py``, bf16, head dims 128/128 and 192/128, where this gives
        eight) eight warps and three stages were the fastest setting of every kernel but one: the
        causal MLA ``dkdv_kernel``, two stages 1% faster."""
        warps = 4 if block * (looped + width) <= 96 * 128 else 8
        steps = [{inner: looped, "num_warps": warps, "num_stages": s} for s in (3, 2, 1)]
        return steps + [{inner: looped // 2, "num_warps": 4, "num_stages": 1}]

    def ladders(self, blocks: tuple[int, ...], looped: int, width: int, outer: str = "BM",
                inner: str = "BN") -> list[dict]:
        """``ladder`` of each of ``blocks`` in turn (the constexpr ``outer``): where no step of one block
        size fits the GPU's shared memory, the next, smaller one (the grids follow the step's block)."""
        return [{outer: block} | step for block in blocks for step in self.ladder(block, looped, width, inner)]


def make_layout(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q, cu_seqlens_k, *, scale: float,
                causal: bool, precision: str, window_size: tuple[int | None, int | None] | None = None,
                softcap: float | None = None) -> Layout:
    """The layout of validated inputs q ``[B, T, H, Dqk]``, k ``[B, S, Hk, Dqk]``, v ``[B, S, Hk, Dv]``, a
    validated ``window_size`` (``references.attention.check_window``) and softcap."""
    left, right = window_size or (None, None)
    if causal:
        right = 0 if right is None else min(right, 0)
    B, T, H, Dqk = q.shape
    S, Hk = k.shape[1], k.shape[2]
    dev, i32 = q.device, torch.int32
    if cu_seqlens_q is None:
        rows = torch.arange(B + 1, device=dev, dtype=i32)
        cu_q, cu_k, max_q, max_k = rows * T, rows * S, T, S
    else:
        cu_q, cu_k = cu_seqlens_q.to(device=dev, dtype=i32), cu_seqlens_k.to(device=dev, dtype=i32)
        max_q, max_k = (int(c.diff().max()) for c in (cu_q, cu_k))
    return Layout(B, T, H, H // Hk, cu_q.contiguous(), cu_k.contiguous(), max_q, max_k, Dqk, v.shape[-1],
                  q.element_size(), scale, (left, right), softcap, precision, cu_seqlens_q is None)
