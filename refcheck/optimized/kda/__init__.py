"""KDA in Triton: the decay gate and the chunked delta rule (forward and backward)."""
from .api import kda, kda_gate

__all__ = ["kda", "kda_gate"]
