"""Law 12 against a kernel that reads past the end of a contiguous input (flash-linear-attention #1134:
the gate load of ``fused_recurrent_kda`` over ``next_pow2(K)`` lanes had no mask and read past the last
row of ``g``), behind a wrapper that makes every input contiguous (flash-linear-attention's
``input_guard``). The strided layout of ``reads_past_input`` alone never shows such a kernel poison (the
wrapper copies a strided view into fresh memory); the contiguous layout does. A kda_gate kernel in
plain PyTorch stands in for the Triton one: its unmasked load is emulated by reading the memory that
follows ``g`` (its storage), and the lanes past K enter the output multiplied by zero, as the padded
rows of the recurrent state do (0 * NaN = NaN)."""
from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import Phase, settings

from refcheck.engine import laws
from refcheck.engine.examples import Example
from refcheck.engine.laws import LawViolation, check, hypothesis_check, in_poisoned_buffer, in_poisoned_margins
from refcheck.model import naive, registry
from refcheck.model.case import Case
from refcheck.model.ops import card
from refcheck.strategies import profiles

MODULE = "tests.test_reads_past_input"
CI = profiles.PROFILES["ci"]


def input_guard(fn):
    """What flash-linear-attention's ``input_guard`` does: every tensor argument made contiguous."""
    @functools.wraps(fn)
    def guarded(*args, **kwargs):
        args = [a.contiguous() if isinstance(a, torch.Tensor) else a for a in args]
        kwargs = {n: a.contiguous() if isinstance(a, torch.Tensor) else a for n, a in kwargs.items()}
        return fn(*args, **kwargs)
    return guarded


def unmasked_rows(x: torch.Tensor, lanes: int) -> torch.Tensor:
    """Every row (last dimension) of the contiguous ``x`` loaded over ``lanes`` lanes without a mask, as a
    kernel indexing from ``x``'s data pointer does: the lanes past a row's end read the next row, those of
    the last row whatever follows ``x`` in memory: the rest of its storage (the poison of a buffer ``x``
    is a view into), 0 past the storage's end (a tight allocation; what follows it is taken to be
    harmless memory, since on the CPU it cannot be read safely)."""
    assert x.is_contiguous()
    k = x.shape[-1]
    rows = x.numel() // k if k else 0
    if rows == 0:
        return x.new_zeros(*x.shape[:-1], lanes)
    start, size = x.storage_offset(), x.untyped_storage().nbytes() // x.element_size()
    wanted = (rows - 1) * k + lanes
    have = min(wanted, size - start)
    memory = torch.cat([x.detach().as_strided((have,), (1,), start), x.new_zeros(wanted - have)])
    index = (torch.arange(rows) * k)[:, None] + torch.arange(lanes)
    return memory[index].view(*x.shape[:-1], lanes)


def next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _gate(g, A_log, dt_bias, lower_bound, lanes: int):
    """The kda gate, ``g`` loaded over ``lanes`` lanes, those past K multiplied by zero into every output."""
    gate = naive.kda_gate(g, A_log, dt_bias, lower_bound)
    padded = unmasked_rows(g, lanes)[..., g.shape[-1]:].float()
    return gate + 0 * padded.sum(-1, keepdim=True)


@input_guard
def gate_unmasked(g, A_log, dt_bias=None, lower_bound=None):
    """Loads g over next_pow2(K) lanes with no mask (flash-linear-attention #1134)."""
    return _gate(g, A_log, dt_bias, lower_bound, next_pow2(g.shape[-1]))


@input_guard
def gate_masked(g, A_log, dt_bias=None, lower_bound=None):
    """The same kernel with the load masked to K lanes: correct."""
    return _gate(g, A_log, dt_bias, lower_bound, g.shape[-1])


def impl(name: str) -> registry.Implementation:
    return registry.resolve(f"kda_gate={MODULE}:{name}")[0]


def example(k: int, dtype: str = "fp32") -> Example:
    case = Case.make("kda_gate", {"B": 2, "T": 5, "H": 2, "K": k}, dtype, 7, options={"lower_bound": None},
                     draw={"input_scale": 1.0, "dt_bias": True})
    return Example(case, impl("gate_masked").modes[0])


STRIDED_ONLY = {"strided": laws.POISON_LAYOUTS["strided"]}
"""The law before the contiguous layout."""


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_contiguous_layout_catches_a_read_past_the_end(dtype):
    with pytest.raises(LawViolation, match="the contiguous layout let poison") as caught:
        check("reads_past_input", impl("gate_unmasked"), example(100, dtype))
    assert "on valid input" not in str(caught.value)
    assert "reproduce: python -c" in str(caught.value) and f"{MODULE}:gate_unmasked" in str(caught.value)


def test_the_strided_layout_alone_misses_it(monkeypatch):
    """Behind the guard the strided views are copied into fresh memory: nothing past the end is poison."""
    inputs = card("kda_gate").make_inputs(example(100).case, torch.device("cpu"))
    strided = gate_unmasked(*(in_poisoned_buffer(inputs.tensors[n]) for n in ("g", "A_log", "dt_bias")))
    contiguous = gate_unmasked(*(in_poisoned_margins(inputs.tensors[n]) for n in ("g", "A_log", "dt_bias")))
    assert torch.isfinite(strided).all() and not torch.isfinite(contiguous).all()
    monkeypatch.setattr(laws, "POISON_LAYOUTS", STRIDED_ONLY)
    check("reads_past_input", impl("gate_unmasked"), example(100))


def test_a_power_of_two_k_reads_nothing_past_the_end():
    """Why the strategies must draw K that are not powers of two: with K = 64 the load is in bounds."""
    check("reads_past_input", impl("gate_unmasked"), example(64))


@pytest.mark.parametrize("k", [1, 3, 64, 100])
def test_the_masked_kernel_passes_both_layouts(k):
    check("reads_past_input", impl("gate_masked"), example(k))


def test_drawn_examples_find_it():
    """The ci profile's examples (derandomized, no shrinking: the kill is what counts) draw a K that is not a
    power of two; the strided layout alone lets the same examples pass."""
    no_shrink = settings(**{**CI, "phases": (Phase.explicit, Phase.generate)})
    with pytest.raises(LawViolation, match="law reads_past_input .*violated"):
        hypothesis_check("reads_past_input", impl("gate_unmasked"), settings=no_shrink)
    hypothesis_check("reads_past_input", impl("gate_masked"), settings=settings(**CI))


def test_the_strided_law_misses_the_drawn_examples(monkeypatch):
    monkeypatch.setattr(laws, "POISON_LAYOUTS", STRIDED_ONLY)
    hypothesis_check("reads_past_input", impl("gate_unmasked"), settings=settings(**CI))
