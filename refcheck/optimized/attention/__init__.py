"""Softmax attention in Triton (FlashAttention-2 schedule): GQA, MLA head dims, causal, varlen."""
from .api import attention

__all__ = ["attention"]
