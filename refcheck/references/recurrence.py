"""Evaluation of a linear-attention recurrence over (packed) sequences.

Every linear-attention op here keeps, per sequence and head, a state ``S`` of shape ``[K, V]``.
``over_sequences`` owns the bookkeeping that all of them share (sequence spans, initial and final
states, reassembling the output); ``scan`` walks a sequence one token at a time with the op's
``step``, and ``references.chunk.chunk_scan`` one chunk at a time.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from .contract import check_state, check_state_pool, sequence_spans

Step = Callable[[torch.Tensor, dict[str, torch.Tensor]], tuple[torch.Tensor, torch.Tensor]]
Sequence = Callable[[torch.Tensor, dict[str, torch.Tensor]], tuple[torch.Tensor, torch.Tensor]]


def over_sequences(run_sequence: Sequence, inputs: dict[str, torch.Tensor], k_dim: int, v_dim: int,
                   initial_state: torch.Tensor | None, output_final_state: bool,
                   cu_seqlens: torch.Tensor | None, state_indices: torch.Tensor | None = None,
                   inplace_final_state: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run ``state, o = run_sequence(state, x)`` on each sequence.

    inputs: name -> ``[B, T, H, ...]`` tensors, all in the compute dtype; ``x`` holds one sequence's
    ``[L, H, ...]`` slices, and ``o`` is its output ``[L, H, V]``. The state starts at
    ``initial_state[n]`` (``[N, H, K, V]``) or 0. Returns ``o [B, T, H, V]`` and, if asked, the
    final states ``[N, H, K, V]``.

    A state pool (serving's decode): with ``state_indices [N]`` the initial state is a pool
    ``[P, H, K, V]`` and sequence n starts at ``initial_state[state_indices[n]]``; with
    ``inplace_final_state`` its final state is written back into that slot (in place: the one side
    effect of the contract) and none is returned.
    """
    first = next(iter(inputs.values()))
    batch, length, heads = first.shape[:3]
    spans = sequence_spans(cu_seqlens, batch, length)
    pool, slots = None, None
    if state_indices is not None:
        pool, slots = check_state_pool(initial_state, state_indices, len(spans), heads, k_dim, v_dim,
                                       inplace=inplace_final_state, output_final_state=output_final_state)
        initial_state = pool[slots]
    elif inplace_final_state:
        raise ValueError("inplace_final_state: needs ssm_state_indices (the pool slots to write the final states into)")
    if initial_state is not None:
        check_state("initial_state", initial_state, len(spans), heads, k_dim, v_dim)
    rows: list[list[torch.Tensor]] = [[] for _ in range(batch)]
    finals: list[torch.Tensor] = []
    for n, (b, start, end) in enumerate(spans):
        state = first.new_zeros(heads, k_dim, v_dim) if initial_state is None else initial_state[n].to(first.dtype)
        state, o = run_sequence(state, {name: x[b, start:end] for name, x in inputs.items()})
        rows[b].append(o)
        finals.append(state)
    out = torch.stack([torch.cat(r) if r else first.new_zeros(0, heads, v_dim) for r in rows])
    if pool is not None and inplace_final_state:
        with torch.no_grad():
            pool[slots] = torch.stack(finals).to(pool.dtype)
        return out, None
    return out, (torch.stack(finals) if output_final_state else None)


def scan(step: Step, inputs: dict[str, torch.Tensor], k_dim: int, v_dim: int,
         initial_state: torch.Tensor | None, output_final_state: bool,
         cu_seqlens: torch.Tensor | None, **pool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run ``S, o_t = step(S, x_t)`` token by token; ``x_t`` holds the ``[H, ...]`` slices at step t;
    ``pool``: ``over_sequences``' state pool keywords."""
    def run_sequence(state, seq):
        outs = [state.new_zeros(0, state.shape[0], v_dim)]
        # unbind once, not x[t] per step: its backward assembles the gradient once, not once per step.
        for values in zip(*(x.unbind(0) for x in seq.values())):
            state, o_t = step(state, dict(zip(seq, values)))
            outs.append(o_t.unsqueeze(0))
        return state, torch.cat(outs)

    return over_sequences(run_sequence, inputs, k_dim, v_dim, initial_state, output_final_state, cu_seqlens, **pool)
