"""The float64 references behind each op's contract signature, as plain callables for the
``refcheck fuzz`` tests: floating inputs upcast to float64, outputs cast back to the contract dtypes
(``o`` in the input dtype; states, ``lse`` and gates float32). Fuzzing them must find nothing."""
from __future__ import annotations

import torch

from refcheck import references


def _f64(x):
    return x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x


def _call(name: str, args, options):
    return getattr(references, name)(*map(_f64, args), **{k: _f64(v) for k, v in options.items()})


def _fp32(x):
    return None if x is None else x.float()


def kda_gate(g, A_log, dt_bias=None, lower_bound=None):
    return _fp32(_call("kda_gate", (g, A_log), {"dt_bias": dt_bias, "lower_bound": lower_bound}))


def kda(q, k, v, g, beta, **options):
    o, state = _call("kda", (q, k, v, g, beta), options)
    return o.to(q.dtype), _fp32(state)


def gla(q, k, v, g, **options):
    o, state = _call("gla", (q, k, v, g), options)
    return o.to(q.dtype), _fp32(state)


def simple_gla(q, k, v, g, **options):
    o, state = _call("simple_gla", (q, k, v, g), options)
    return o.to(q.dtype), _fp32(state)


def attention(q, k, v, **options):
    o, lse = _call("attention", (q, k, v), options)
    return o.to(q.dtype), lse.float()
