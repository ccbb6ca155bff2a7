"""Gated DeltaNet (``references.gated_delta_rule``): the recurrent kernel that serving's decode calls, one
token (or a few) per sequence, its state read from a pool slot and written back in place."""
from .api import gated_delta_rule_recurrent

__all__ = ["gated_delta_rule_recurrent"]
