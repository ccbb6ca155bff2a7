"""The registry's own promises: how an implementation's precision modes are declared."""
import pytest

from refcheck import registry
from refcheck.registry import Implementation


def test_an_implementation_without_the_knob_is_judged_at_its_fixed_mode():
    # FLA's Triton kernels run fp32 tl.dot at Triton's default, tf32: judging them by the ieee budgets
    # (1e-5) would fail every fp32 case for a documented choice, not a defect
    fla = {i.op: i for i in registry.BUILTIN if i.name == "fla_chunk"}
    assert {op: i.modes for op, i in fla.items()} == {op: ("tf32",) for op in ("kda", "gla", "simple_gla")}
    assert Implementation("kda", "x", "m:f").modes == ("ieee",)
    triton = next(i for i in registry.BUILTIN if (i.op, i.name) == ("kda", "triton"))
    assert triton.modes == ("ieee", "tf32", "tf32x3")


def test_fixed_mode_must_be_a_precision_mode():
    with pytest.raises(ValueError, match="fixed_mode"):
        Implementation("kda", "x", "m:f", fixed_mode="bf16")


def test_a_family_name_selects_every_member_and_a_member_name_one():
    fla = registry.resolve("fla")
    assert {(i.op, i.name) for i in fla} == {(op, name) for op in ("kda", "gla", "simple_gla")
                                             for name in ("fla_chunk", "fla_recurrent")}
    assert [(i.op, i.name) for i in registry.resolve("kda=fla_chunk")] == [("kda", "fla_chunk")]
    for impl in fla:   # the adapters import flash-linear-attention only when called
        assert registry.contract_problems(impl.fn, impl.op, list(impl.knobs)) == []


def test_a_peer_that_asserts_even_head_dims_gets_even_ones_in_those_dtypes():
    from hypothesis import given, settings

    from refcheck.strategies import LARGE, cases
    impl = registry.get("simple_gla", "fla_chunk")
    assert impl.even_dims == ("bf16", "fp16")
    seen = set()

    @settings(max_examples=60, deadline=None, database=None)
    @given(cases("simple_gla", impl, LARGE))
    def check(case):
        d = case.dim
        if case.dtype in impl.even_dims:
            assert d["K"] % 2 == 0 and d["V"] % 2 == 0
        seen.add(case.dtype)
    check()
    assert {"bf16", "fp16"} & seen
