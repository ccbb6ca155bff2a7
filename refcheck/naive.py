"""The naive implementations: each reference evaluated in the input dtype.

Two forms: recurrent (``kda``, ``gla``, ...: the reference as written) and, for the ops with a
chunk form, chunked (``kda_chunked``, ...: chunks of 64 with the in-chunk decays formed from
differences of the cumulative log-decay, as kernels form them, so that they share the kernels'
cancellation under steep decays). The larger of their errors is the yardstick of the contract
bounds ("at most F times the error of the same computation done naively in the input dtype",
``refcheck.verify.yardstick``); both are also implementations every law runs over.
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


def kda_chunked(q, k, v, g, beta, **options):
    o, state = references.kda_chunked(q, k, v, g, beta, decays="differenced", **options)
    return o, _fp32(state)


def gla_chunked(q, k, v, g, **options):
    o, state = references.gla_chunked(q, k, v, g, decays="differenced", **options)
    return o, _fp32(state)


def simple_gla_chunked(q, k, v, g, **options):
    o, state = references.simple_gla_chunked(q, k, v, g, decays="differenced", **options)
    return o, _fp32(state)
