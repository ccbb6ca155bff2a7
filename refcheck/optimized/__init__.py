"""refcheck's own Triton kernels, one package per op family; each public function has its op's
contract signature plus keyword-only knobs. ``chunk`` holds what the chunked linear-attention
families share (tile layouts, the serial state pass)."""
from .attention import attention
from .gated_delta_rule import gated_delta_rule_chunk, gated_delta_rule_recurrent
from .gla import gla, simple_gla
from .kda import kda, kda_gate
from .paged_attention import paged_attention

__all__ = ["attention", "gated_delta_rule_chunk", "gated_delta_rule_recurrent", "gla", "kda", "kda_gate",
           "paged_attention", "simple_gla"]
