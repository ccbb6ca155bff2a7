"""refcheck's own Triton kernels, one package per op family; each public function has its op's
contract signature plus keyword-only knobs."""
from .attention import attention
from .kda import kda, kda_gate

__all__ = ["attention", "kda", "kda_gate"]
