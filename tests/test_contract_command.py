"""``refcheck contract OP``: it names every parameter of the op's reference, states the output dtypes
the engine checks (the references' docstrings state the same ones) and the input dtypes the laws hand
over, lists the laws; what it says of options and edge cases is checked by the grid; an unknown op is
a usage error."""
from __future__ import annotations

import importlib
import inspect
import json
import re
import types

import pytest
import torch

from refcheck.commands.cli import main
from refcheck.commands.contract import INPUT_DTYPE, input_dtypes, output_dtypes
from refcheck.engine.verify import output_dtype
from refcheck.model.case import DTYPES, Case
from refcheck.model.ops import OPS

BUILT_IN = ("attention", "gated_delta_rule", "gla", "kda", "kda_gate", "simple_gla")


def documented_dtypes(doc: str) -> dict[str, str]:
    """What a reference's ``Returns`` paragraph says a kernel returns each output in: the pairs
    ``NAME in DTYPE`` after the word "contract" (DTYPE ``the input dtype``, ``q.dtype`` or a torch name)."""
    returns = next((p for p in inspect.cleandoc(doc).split("\n\n") if p.startswith("Returns")), None)
    assert returns is not None, f"no Returns paragraph in:\n{doc}"
    _, found, promise = " ".join(returns.split()).partition("contract")
    assert found, f"the Returns paragraph states no contract dtypes: {returns!r}"
    pairs = re.findall(r"\b(\w+) in (the input dtype|``q\.dtype``|q\.dtype|b?float\d+)", promise)
    return {name: INPUT_DTYPE if "q.dtype" in dtype else dtype for name, dtype in pairs}


@pytest.mark.parametrize("op", BUILT_IN)
def test_the_command_names_every_parameter_of_the_reference(op, capsys):
    assert main(["contract", op]) == 0
    out = capsys.readouterr().out
    for name, param in inspect.signature(OPS[op].reference).parameters.items():
        assert re.search(rf"\b{name}\b", out), f"{op}: parameter {name} not named"
        if param.default is not inspect.Parameter.empty:
            assert f"{name}={param.default!r}" in out, f"{op}: the default of {name} not printed"
    for name in OPS[op].outputs:
        assert re.search(rf"\b{name} in ", out)
    if "scale" in inspect.signature(OPS[op].reference).parameters:
        assert "q.shape[-1] ** -0.5" in out


@pytest.mark.parametrize("op", BUILT_IN)
def test_json_says_the_same(op, capsys):
    assert main(["contract", op, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert [p["name"] for p in info["parameters"]] == list(inspect.signature(OPS[op].reference).parameters)
    assert info["dtypes_in"] == list(OPS[op].dtypes)
    assert list(info["outputs"]) == list(OPS[op].outputs)
    assert info["examples"] and all(set(ex["outputs"]) <= set(OPS[op].outputs) for ex in info["examples"])


@pytest.mark.parametrize("op", BUILT_IN)
def test_the_documented_output_dtypes_are_the_contracts(op):
    """The command's output dtypes are those ``verify`` checks, and the reference's docstring says the same."""
    c = OPS[op]
    stated = output_dtypes(c)
    for name in c.outputs:
        for dtype in c.dtypes:
            want = output_dtype(Case.make(op, {}, dtype, 0), name)
            assert (DTYPES[dtype] if stated[name] == INPUT_DTYPE else getattr(torch, stated[name])) == want
    assert documented_dtypes(c.reference.__doc__ or "") == stated, f"{c.reference.__qualname__}'s docstring"
    if c.chunked_reference is not None and "dtypes are the contract's" in (c.chunked_reference.__doc__ or ""):
        assert documented_dtypes(c.chunked_reference.__doc__ or "") == stated


def test_a_docstring_that_disagrees_with_the_contract_fails():
    old = "Attention, densely.\n\nReturns ``(o [B, T, H, Dv] in q.dtype, lse [B, H, T] in q.dtype)``."
    with pytest.raises(AssertionError, match="no contract dtypes"):
        documented_dtypes(old)
    wrong = "Attention.\n\nReturns ``(o, lse)``; by the contract a kernel returns o in the input dtype and lse in q.dtype."
    assert documented_dtypes(wrong) != output_dtypes(OPS["attention"])


def test_an_unknown_op_is_a_usage_error(capsys):
    assert main(["contract", "atention"]) == 2
    err = capsys.readouterr().err
    assert "atention" in err and all(op in err for op in BUILT_IN)


def test_the_reference_modules_are_reached_by_import():
    """The package's attributes are the functions (``references.attention(...)``); the modules are
    reached by import, as its docstring says."""
    import refcheck.references as references
    assert isinstance(references.attention, types.FunctionType)
    module = importlib.import_module("refcheck.references.attention")
    assert isinstance(module, types.ModuleType) and module.attention is references.attention


def allows(stated: str, case_dtype: str, dtype: torch.dtype) -> bool:
    """Whether a tensor of ``dtype`` in a case of ``case_dtype`` is one the statement ``stated`` allows."""
    names = set(re.findall(r"\b(?:b?float|int)\d+\b", stated))
    if INPUT_DTYPE in stated:
        names.add(str(DTYPES[case_dtype]).removeprefix("torch."))
    return str(dtype).removeprefix("torch.") in names


@pytest.mark.parametrize("op", BUILT_IN)
def test_the_stated_input_dtypes_are_those_the_laws_hand_over(op):
    """Every tensor of a case drawn as the laws draw them has a dtype the contract states for it (a
    tensor the contract does not name fails too)."""
    from hypothesis import given, settings

    from refcheck.engine import examples
    c = OPS[op]
    stated = input_dtypes(c)
    assert stated and all(stated.values())

    @settings(max_examples=60, derandomize=True, database=None, deadline=None)
    @given(examples.cases(op))
    def check(case):
        for name, t in c.make_inputs(case, torch.device("cpu")).tensors.items():
            assert allows(stated[name], case.dtype, t.dtype), f"{op} {case.describe()}: {name} {t.dtype}, stated {stated[name]}"
    check()


def test_a_dtype_statement_that_is_too_narrow_is_caught():
    assert allows("the input dtype", "bf16", torch.bfloat16) and not allows("the input dtype", "bf16", torch.float32)
    assert allows("float32", "bf16", torch.float32) and not allows("float32", "fp32", torch.float16)
    assert allows("any of bfloat16, float16, float32, whatever the input dtype", "fp32", torch.float16)


@pytest.mark.parametrize("op", ["attention", "kda"])
def test_the_command_lists_the_laws_of_the_op(op, capsys):
    from refcheck.engine.laws import LAWS
    assert main(["contract", op]) == 0
    out = capsys.readouterr().out
    laws = out.split("\nlaws it is held to", 1)[1].split("\n\n", 1)[0]
    for law in LAWS.values():
        assert (f"  {law.name}: " in laws) == (law.why_not_op(OPS[op]) is None), law.name


def _naive_linear(op):
    from refcheck.model import naive
    return getattr(naive, op)


def _returns_a_state_nobody_asked_for(q, k, v, g, *, output_final_state=False, **options):
    return _naive_linear("simple_gla")(q, k, v, g, output_final_state=True, **options)


def _ignores_the_scale(q, k, v, g, *, scale=None, **options):
    return _naive_linear("simple_gla")(q, k, v, g, **options)


@pytest.mark.parametrize("fn, label, says", [
    (_returns_a_state_nobody_asked_for, "varlen_no_h0", "final_state: returned, where the reference returns None"),
    (_ignores_the_scale, "chunk_plus_one", None)])
def test_the_grid_checks_what_the_contract_says_of_options(fn, label, says):
    """The contract's "final_state is None unless output_final_state=True" and "a given scale" are
    met by grid cases: a kernel that breaks either fails there (and passes the other cases)."""
    from refcheck.engine import grid
    from refcheck.engine.verify import verify
    from refcheck.model.registry import Implementation
    impl = Implementation("simple_gla", fn.__name__, f"{__name__}:{fn.__name__}")
    verdicts = {e.label: verify(impl, e.case) for e in grid.cases("simple_gla") if e.case.dtype == "fp32" and not e.sweep}
    assert [name for name, v in verdicts.items() if not v.passed] == [label]
    if says:
        assert any(says in p for p in verdicts[label].problems), verdicts[label].problems
