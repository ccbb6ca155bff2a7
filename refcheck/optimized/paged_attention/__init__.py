"""Paged decode attention: ``api.paged_attention`` (checks, knobs) over ``decode`` (the split-K kernel and
its combine)."""
from .api import paged_attention

__all__ = ["paged_attention"]
