"""GLA and simple GLA in Triton: chunked forward and backward, sharing KDA's state pass."""
from .api import gla, simple_gla

__all__ = ["gla", "simple_gla"]
