"""Gated DeltaNet (``references.gated_delta_rule``): the chunked kernels (KDA's, one decay per value head: prefill and
training, forward and backward) and the recurrent kernel that serving's decode calls, one token (or a few) per
sequence, its state read from a pool slot and written back in place."""
from .api import gated_delta_rule_recurrent
from .chunk import gated_delta_rule_chunk

__all__ = ["gated_delta_rule_chunk", "gated_delta_rule_recurrent"]
