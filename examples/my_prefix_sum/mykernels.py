"""The author's kernels for ``prefix_sum`` (plain PyTorch here; a Triton kernel is named the same way):
one correct in blocks of 16 with float32 sums, one with a classic bug."""
from __future__ import annotations

import torch


def _blocked(x, scale, reset):
    out = torch.empty_like(x)
    carry = torch.zeros_like(x[:, 0], dtype=torch.float32)
    for start in range(0, x.shape[1], 16):
        block = x[:, start:start + 16].float().cumsum(1) + carry.unsqueeze(1)
        for t in range(block.shape[1]):
            if reset[start + t]:
                block[:, t:] -= block[:, t - 1:t] if t else carry.unsqueeze(1)
        out[:, start:start + 16] = (scale * block).to(x.dtype)
        carry = block[:, -1]
    return out


def _resets(x, cu_seqlens):
    reset = [False] * x.shape[1]
    for s in (cu_seqlens.tolist()[1:-1] if cu_seqlens is not None else []):
        if s < x.shape[1]:
            reset[s] = True
    return reset


def prefix_sum(x, *, scale=1.0, cu_seqlens=None):
    """Correct: blocks of 16, the running sum carried in float32 and restarted at each sequence."""
    return _blocked(x, scale, _resets(x, cu_seqlens))


def bug_no_reset(x, *, scale=1.0, cu_seqlens=None):
    """Bug: the running sum is not restarted where a packed sequence begins."""
    return _blocked(x, scale, [False] * x.shape[1])
