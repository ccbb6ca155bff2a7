"""Float64 truth for every refcheck op: pure PyTorch, written from the math, certified by mpmath.

Each function computes in the dtype of its inputs (``q`` or ``g``): pass float64 tensors for the
truth; the same code in a low-precision dtype is the "naive" baseline.

The functions are this package's attributes (``references.attention(q, k, v)``), so a function
shadows the module of the same name: ``refcheck.references.attention`` (also after ``import
refcheck.references.attention as m``) is the function ``attention``, not ``attention.py``; likewise
``gla``, ``kda``, ``gated_delta_rule`` and ``paged_attention``. Reach a module by importing from it (``from
refcheck.references.attention import attention_chunked``) or with
``importlib.import_module("refcheck.references.attention")``; ``refcheck contract OP`` prints the
module of an op's reference with its docstring (shapes and math).
"""
from .attention import attention, attention_chunked
from .gated_delta_rule import gated_delta_rule, gated_delta_rule_chunked
from .gates import kda_gate
from .gla import gla, gla_chunked, simple_gla, simple_gla_chunked
from .kda import kda, kda_chunked
from .paged_attention import paged_attention, paged_attention_chunked

__all__ = ["attention", "attention_chunked", "gated_delta_rule", "gated_delta_rule_chunked", "gla", "gla_chunked", "kda",
           "kda_chunked", "kda_gate", "paged_attention", "paged_attention_chunked", "simple_gla", "simple_gla_chunked"]
