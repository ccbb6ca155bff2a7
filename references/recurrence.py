"""Step-by-step evaluation of a linear-attention recurrence over (packed) sequences.

Every linear-attention op here keeps, per sequence and head, a state ``S`` of shape ``[K, V]`` and
walks the sequence one token at a time. ``scan`` owns the bookkeeping that all of them share
(sequence spans, initial and final states); the op supplies one ``step``.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from .contract import check_state, sequence_spans

Step = Callable[[torch.Tensor, dict[str, torch.Tensor]], tuple[torch.Tensor, torch.Tensor]]


def scan(step: Step, inputs: dict[str, torch.Tensor], k_dim: int, v_dim: int,
         initial_state: torch.Tensor | None, output_final_state: bool,
         cu_seqlens: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run ``S, o_t = step(S, x_t)`` over each sequence.

    inputs: name -> ``[B, T, H, ...]`` tensors, all in the compute dtype; ``x_t`` holds their
    ``[H, ...]`` slices at step t. The state starts at ``initial_state[n]`` (``[N, H, K, V]``) or 0.
    Returns ``o [B, T, H, V]`` and, if asked, the final states ``[N, H, K, V]``.
    """
    first = next(iter(inputs.values()))
    batch, length, heads = first.shape[:3]
    spans = sequence_spans(cu_seqlens, batch, length)
    if initial_state is not None:
        check_state("initial_state", initial_state, len(spans), heads, k_dim, v_dim)
    rows, finals = [[] for _ in range(batch)], []
    for n, (b, start, end) in enumerate(spans):
        if initial_state is None:
            state = first.new_zeros(heads, k_dim, v_dim)
        else:
            state = initial_state[n].to(first.dtype)
        for t in range(start, end):
            state, o_t = step(state, {name: x[b, t] for name, x in inputs.items()})
            rows[b].append(o_t)
        finals.append(state)
    out = torch.stack([torch.stack(r) if r else first.new_zeros(0, heads, v_dim) for r in rows])
    return out, (torch.stack(finals) if output_final_state else None)
