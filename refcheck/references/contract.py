"""Input checks shared by every implementation of the refcheck ops.

The op contract (sequence-first tensors, ``cu_seqlens`` for packed variable-length batches,
float32 states) is checked here once; references and kernels call these helpers so that bad input
always fails the same way: a ``ValueError`` that names the argument and says what was expected.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

FLOAT_DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


def check_tensor(name: str, x, ndim: int, dtypes: Sequence[torch.dtype] = FLOAT_DTYPES) -> torch.Tensor:
    """``x`` must be a tensor of rank ``ndim`` whose dtype is one of ``dtypes``."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.ndim != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {tuple(x.shape)}")
    if x.dtype not in dtypes:
        names = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise ValueError(f"{name}: expected dtype in ({names}), got {str(x.dtype).removeprefix('torch.')}")
    return x


def check_shape(name: str, x: torch.Tensor, expected: Sequence[int], what: str = "") -> None:
    """``x.shape`` must equal ``expected``; ``what`` explains the expected shape in symbols."""
    if tuple(x.shape) != tuple(expected):
        hint = f" ({what})" if what else ""
        raise ValueError(f"{name}: expected shape {tuple(expected)}{hint}, got {tuple(x.shape)}")


def check_linear_qkv(q, k, v) -> tuple[int, int, int, int, int]:
    """q, k ``[B, T, H, K]`` and v ``[B, T, H, V]`` of a linear-attention op; return (B, T, H, K, V)."""
    check_tensor("q", q, 4)
    b, t, h, kd = q.shape
    check_tensor("k", k, 4)
    check_shape("k", k, q.shape, "[B, T, H, K] like q")
    check_tensor("v", v, 4)
    check_shape("v", v, (b, t, h, v.shape[-1]), "[B, T, H, V]")
    return b, t, h, kd, v.shape[-1]


def check_cu_seqlens(cu_seqlens, batch: int, length: int, name: str = "cu_seqlens") -> list[tuple[int, int]]:
    """Validate packed-sequence boundaries and return the ``(start, end)`` span of each sequence.

    ``cu_seqlens`` is a 1-D int32/int64 tensor ``[N+1]``: 0 first, non-decreasing, ``length`` last;
    it requires ``batch == 1``. Zero-length sequences are allowed.
    """
    check_tensor(name, cu_seqlens, 1, (torch.int32, torch.int64))
    if batch != 1:
        raise ValueError(f"{name}: packed sequences need batch size 1, got B={batch}")
    bounds = cu_seqlens.tolist()
    if len(bounds) < 2:
        raise ValueError(f"{name}: expected at least 2 entries [0, ..., T], got {bounds}")
    if bounds[0] != 0:
        raise ValueError(f"{name}: must start at 0, got {bounds[0]}")
    if any(b < a for a, b in zip(bounds, bounds[1:])):
        raise ValueError(f"{name}: must be non-decreasing, got {bounds}")
    if bounds[-1] != length:
        raise ValueError(f"{name}: must end at the sequence length T={length}, got {bounds[-1]}")
    return list(zip(bounds[:-1], bounds[1:]))


def sequence_spans(cu_seqlens, batch: int, length: int, name: str = "cu_seqlens") -> list[tuple[int, int, int]]:
    """The sequences of a batch as ``(row, start, end)``: one per batch row, or one per packed span."""
    if cu_seqlens is None:
        return [(b, 0, length) for b in range(batch)]
    return [(0, s, e) for s, e in check_cu_seqlens(cu_seqlens, batch, length, name)]


def check_state(name: str, state, n: int, h: int, k: int, v: int) -> torch.Tensor:
    """A recurrent state ``[N, H, K, V]``; float32 by contract (float64 accepted for the truth)."""
    check_tensor(name, state, 4, (torch.float32, torch.float64))
    check_shape(name, state, (n, h, k, v), "[N, H, K, V] with N = number of sequences")
    return state


def check_state_pool(pool, indices, n: int, h: int, k: int, v: int, *, inplace: bool,
                     output_final_state: bool) -> tuple[torch.Tensor, list[int]]:
    """A decode step's states held in a pool (serving's continuous batching): ``pool`` (given as
    ``initial_state``) ``[P, H, K, V]`` float32, ``indices`` (``ssm_state_indices``) a 1-D int tensor
    ``[N]`` naming each sequence's slot in ``[0, P)``, distinct when the final states are written back
    (``inplace``: then no final state is returned as well). Returns the pool and the slots as ints."""
    if pool is None:
        raise ValueError("initial_state: required with ssm_state_indices (the pool of states the indices name)")
    check_tensor("initial_state", pool, 4, (torch.float32, torch.float64))
    if tuple(pool.shape[1:]) != (h, k, v):
        raise ValueError(f"initial_state: expected a pool of shape (P, {h}, {k}, {v}) ([P, H, K, V]: P slots) "
                         f"with ssm_state_indices, got {tuple(pool.shape)}")
    check_tensor("ssm_state_indices", indices, 1, (torch.int32, torch.int64))
    slots = indices.tolist()
    if len(slots) != n:
        raise ValueError(f"ssm_state_indices: expected one slot per sequence ({n}), got {len(slots)}")
    if any(not 0 <= s < pool.shape[0] for s in slots):
        raise ValueError(f"ssm_state_indices: expected slots in [0, {pool.shape[0]}) (the pool's P), got {slots}")
    if inplace and len(set(slots)) != len(slots):
        raise ValueError(f"ssm_state_indices: two sequences name one slot, which inplace_final_state would write "
                         f"twice: {slots}")
    if inplace and output_final_state:
        raise ValueError("output_final_state: with inplace_final_state=True the final states are written into "
                         "the pool; ask for one or the other")
    return pool, slots


def check_scale(scale, head_dim: int) -> float:
    """The default softmax/readout scale is ``head_dim ** -0.5``; a given one must be positive."""
    if scale is None:
        return head_dim ** -0.5
    if not isinstance(scale, (int, float)) or not scale > 0:
        raise ValueError(f"scale: expected a positive number, got {scale!r}")
    return float(scale)
