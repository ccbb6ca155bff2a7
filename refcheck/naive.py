"""The naive implementations: each reference evaluated in the input dtype.

They double as the FlashAttention-style baseline ("at most F times the error of the same
computation done naively in the input dtype") and as an implementation every law runs over.
Outputs follow the contract: ``o`` in the input dtype, states, ``lse`` and gates in float32.
"""
from __future__ import annotations


import references


def _fp32(x):
    return None if x is None else x.float()


def kda_gate(g, A_log, dt_bias=None, lower_bound=None):
    return _fp32(references.kda_gate(g, A_log, dt_bias, lower_bound))


def kda(q, k, v, g, beta, **options):
    o, state = references.kda(q, k, v, g, beta, **options)
    return o, _fp32(state)


def gla(q, k, v, g, **options):
    o, state = references.gla(q, k, v, g, **options)
    return o, _fp32(state)


def simple_gla(q, k, v, g, **options):
    o, state = references.simple_gla(q, k, v, g, **options)
    return o, _fp32(state)


def attention(q, k, v, **options):
    o, lse = references.attention(q, k, v, **options)
    return o, lse.float()
