"""The KDA decay gate.

For g ``[B, T, H, K]``, A_log ``[H]`` and dt_bias ``[H*K]`` (viewed as ``[H, K]``), with
``x = g + dt_bias``:

* ``lower_bound is None``:  ``gate = -exp(A_log[h]) * softplus(x)``          (in ``(-inf, 0]``)
* otherwise:                ``gate = lower_bound * sigmoid(exp(A_log[h]) * x)`` (in ``(lower_bound, 0)``)

The result is a log-decay: the state is multiplied by ``exp(gate)`` each step.
"""
from __future__ import annotations

import torch

from .contract import check_shape, check_tensor


def softplus(x: torch.Tensor) -> torch.Tensor:
    """``log(1 + exp(x))`` to full relative precision for every x.

    ``torch.nn.functional.softplus`` returns ``x`` itself beyond its threshold of 20, which is off by
    ``log1p(exp(-x))`` (2e-9 at x = 20): too coarse for a float64 truth. Each branch is fed only
    the half line it serves (clamp), so the branch that ``where`` drops cannot overflow and poison
    the gradient with ``0 * inf = NaN``.
    """
    return torch.where(x > 0, x + torch.log1p(torch.exp(-x.clamp(min=0))),
                       torch.log1p(torch.exp(x.clamp(max=0))))


def kda_gate(g: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor | None = None,
             lower_bound: float | None = None) -> torch.Tensor:
    """The KDA log-decay, computed in the dtype of ``g`` (pass float64 for the truth).

    Returns ``gate [B, T, H, K]``, computed in the dtype of ``g``. A kernel's dtype is the contract's:
    gate in float32.
    """
    check_tensor("g", g, 4)
    _, _, h, k = g.shape
    check_tensor("A_log", A_log, 1)
    check_shape("A_log", A_log, (h,), "[H]")
    x = g
    if dt_bias is not None:
        check_tensor("dt_bias", dt_bias, 1)
        check_shape("dt_bias", dt_bias, (h * k,), "[H*K]")
        x = x + dt_bias.to(g.dtype).view(h, k)
    rate = torch.exp(A_log.to(g.dtype)).view(h, 1)
    if lower_bound is None:
        return -rate * softplus(x)
    if not isinstance(lower_bound, (int, float)) or not (-float("inf") < lower_bound < 0):
        raise ValueError(f"lower_bound: expected a finite negative number, got {lower_bound!r}")
    return lower_bound * torch.sigmoid(rate * x)
