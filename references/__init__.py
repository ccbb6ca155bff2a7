"""Float64 truth for every refcheck op: pure PyTorch, written from the math, certified by mpmath.

Each function computes in the dtype of its inputs (``q`` or ``g``): pass float64 tensors for the
truth; the same code in a low-precision dtype is the "naive" baseline.
"""
from .attention import attention
from .gates import kda_gate
from .gla import gla, simple_gla
from .kda import kda

__all__ = ["attention", "gla", "kda", "kda_gate", "simple_gla"]
