"""The registry's own promises: how an implementation's precision modes are declared."""
import pytest

from refcheck.model import registry
from refcheck.model.registry import Implementation


def test_an_implementation_without_the_knob_is_judged_at_its_fixed_mode():
    # FLA's Triton kernels run fp32 tl.dot at Triton's default, tf32: judging them by the ieee budgets
    # (1e-5) would fail every fp32 case for a documented choice, not a defect
    fla = {i.op: i for i in registry.implementations() if i.name == "fla_chunk"}
    assert {op: i.modes for op, i in fla.items()} == {op: ("tf32",) for op in ("kda", "gla", "simple_gla", "gated_delta_rule")}
    assert Implementation("kda", "x", "m:f").modes == ("ieee",)
    triton = next(i for i in registry.implementations() if (i.op, i.name) == ("kda", "triton"))
    assert triton.modes == ("ieee", "tf32", "tf32x3")


def test_fixed_mode_must_be_a_precision_mode():
    with pytest.raises(ValueError, match="fixed_mode"):
        Implementation("kda", "x", "m:f", fixed_mode="bf16")


def test_a_family_name_selects_every_member_and_a_member_name_one():
    fla = registry.resolve("fla")
    assert {(i.op, i.name) for i in fla} == {(op, name) for op in ("kda", "gla", "simple_gla", "gated_delta_rule")
                                             for name in ("fla_chunk", "fla_recurrent")}
    assert [(i.op, i.name) for i in registry.resolve("kda=fla_chunk")] == [("kda", "fla_chunk")]
    for impl in fla:   # the adapters import flash-linear-attention only when called
        assert registry.contract_problems(impl.fn, impl.op, list(impl.knobs)) == []


def test_a_peer_with_a_smallest_head_dim_gets_no_smaller_one():
    """flash-linear-attention's chunk_gla does not compile its backward below V = 16 (found on an H100):
    its cases keep V >= 16 while K stays free down to 1."""
    from hypothesis import given, settings

    from refcheck.engine.examples import cases
    from refcheck.strategies import SMALL
    impl = registry.get("gla", "fla_chunk")
    assert impl.min_dims == {"V": 16}
    smallest = {"K": 10**9, "V": 10**9}

    @settings(max_examples=80, deadline=None, database=None)
    @given(cases("gla", impl, SMALL))
    def check(case):
        for name in smallest:
            smallest[name] = min(smallest[name], case.dim[name])
    check()
    assert smallest["V"] == 16 and smallest["K"] < 16, smallest


@pytest.mark.parametrize("op, name, multiple", [("simple_gla", "fla_chunk", 2), ("attention", "fa4", 8)])
def test_a_peer_that_asserts_head_dim_multiples_gets_such_dims_in_those_dtypes(op, name, multiple):
    from hypothesis import given, settings

    from refcheck.engine.examples import cases
    from refcheck.strategies import LARGE
    impl = registry.get(op, name)
    assert impl.dim_multiple == {"bf16": multiple, "fp16": multiple}
    seen = set()

    @settings(max_examples=60, deadline=None, database=None)
    @given(cases(op, impl, LARGE))
    def check(case):
        dims = [v for k, v in case.dim.items() if k in ("K", "V", "Dqk", "Dv")]
        assert dims and all(d % impl.dim_multiple.get(case.dtype, 1) == 0 for d in dims), case.dim
        seen.add(case.dtype)
    check()
    assert {"bf16", "fp16"} & seen


def refuse_on_cpu(device: str, case=None):
    if case is not None:
        return "the stand-in refuses the backward of T = 1" if case.dim["T"] == 1 else None
    return "the stand-in refuses its backward on the CPU" if device == "cpu" else None


def test_a_backward_refused_on_a_device_is_checked_forward_only_there_with_the_reason():
    import dataclasses

    from refcheck.commands.selection import select
    from refcheck.engine import grid
    naive = registry.get("gla", "naive")
    refusing = dataclasses.replace(naive, name="refusing", backward_refusal=f"{__name__}:refuse_on_cpu")
    here = refusing.on("cpu")
    assert not here.backward and here.forward_only_because == "the stand-in refuses its backward on the CPU"
    assert naive.on("cpu") is naive and naive.refused_backward("cpu") is None
    selection = select(ops=["gla"], device="cpu")
    assert not selection.narrowed(refusing).backward
    points = [p for p in grid.build("cpu", ops=["gla"], impls=["naive"]).points]
    assert points and all(p.impl.backward for p in points)   # a record without a refusal is unchanged


def test_a_backward_refused_on_a_case_checks_that_case_forward_only():
    import dataclasses

    from refcheck.engine.verify import verify
    from refcheck.model.case import Case
    refusing = dataclasses.replace(registry.get("gla", "naive"), name="refusing",
                                   backward_refusal=f"{__name__}:refuse_on_cpu")

    def outputs(length):
        c = Case.make("gla", {"B": 1, "T": length, "H": 1, "K": 4, "V": 4}, "fp32", 1)
        return {m.output for m in verify(refusing, c).measurements}
    assert "o" in outputs(1) and not {"dq", "dk", "dv", "dg"} & outputs(1)
    assert "dq" in outputs(2)


def test_flash_attn_4_refuses_the_gqa_backward_of_differing_head_dims_only():
    from refcheck.model.case import Case
    from refcheck.model.ops.attention import fa4_backward_refusal

    def case(h, hk, dqk, dv):
        return Case.make("attention", {"B": 1, "T": 8, "S": 8, "H": h, "Hk": hk, "Dqk": dqk, "Dv": dv}, "bf16", 0)
    assert "GQA backward" in fa4_backward_refusal("cuda", case(4, 2, 192, 128))
    assert fa4_backward_refusal("cuda", case(4, 4, 192, 128)) is None
    assert fa4_backward_refusal("cuda", case(4, 2, 64, 64)) is None
    assert fa4_backward_refusal("cuda") is None
