"""The tolerances file: the real one loads and covers every op output; malformed ones fail clearly."""
import pytest

from refcheck import budgets
from refcheck.case import PRECISION_MODES
from refcheck.ops import OPS

GOOD = '''
[kda.o]
bf16 = { metric = "rel_rms", ieee = 1e-2, tf32 = 1e-2, tf32x3 = 1e-2, reason = "measured 3e-3" }
'''
OUTPUTS = {name: card.budget_outputs for name, card in OPS.items()}


def parse(text: str):
    return budgets.parse(text, "t.toml", OUTPUTS)


def test_repository_file_loads_and_covers_every_output():
    loaded = budgets.load()
    for name, op in OPS.items():
        for output in op.budget_outputs:
            for dtype in ("fp32", "bf16", "fp16"):
                for mode in PRECISION_MODES:
                    b = loaded.get(name, output, dtype, mode)
                    assert b.value > 0 and b.reason


def test_good_entry_and_override():
    text = GOOD.replace('reason = "measured 3e-3" }', 'reason = "measured 3e-3", naive = { metric = "rel_rms", '
                        'ieee = 5e-2, tf32 = 5e-2, tf32x3 = 5e-2, reason = "bf16 arithmetic" } }')
    b = parse(text)
    assert b.get("kda", "o", "bf16", "tf32").value == 1e-2
    assert b.get("kda", "o", "bf16", "tf32", impl="naive").value == 5e-2
    assert b.get("kda", "o", "bf16", "tf32", impl="triton").value == 1e-2


@pytest.mark.parametrize("text, message", [
    (GOOD.replace("[kda.o]", "[kdaa.o]"), r"t\.toml: \[kdaa\] unknown op"),
    (GOOD.replace("tf32x3 = 1e-2, ", ""), r"t\.toml: \[kda\.o\.bf16\] missing mode 'tf32x3'"),
    (GOOD.replace("ieee = 1e-2", "ieee = -1e-2"), r"t\.toml: \[kda\.o\.bf16\] ieee must be positive"),
    (GOOD.replace("ieee = 1e-2", "ieee = 0"), r"t\.toml: \[kda\.o\.bf16\] ieee must be positive"),
    (GOOD.replace('"rel_rms"', '"rel_rmse"'), r"t\.toml: \[kda\.o\.bf16\] bad metric name 'rel_rmse'"),
    (GOOD.replace(', reason = "measured 3e-3"', ""), r"t\.toml: \[kda\.o\.bf16\] missing reason"),
    (GOOD.replace("[kda.o]", "[kda.dz]"), r"t\.toml: \[kda\.dz\] unknown output"),
    (GOOD.replace("bf16 =", "bf17 ="), r"t\.toml: \[kda\.o\.bf17\] unknown dtype"),
    (GOOD.replace("ieee = 1e-2", 'ieee = "1e-2"'), r"ieee must be a finite number"),
    (GOOD.replace("ieee = 1e-2", "ieee = inf"), r"ieee must be a finite number"),
    (GOOD.replace("ieee = 1e-2", "ieee = 1e-2, atol = 1"), r"unknown key\(s\) \['atol'\]"),
    (GOOD.replace("ieee = 1e-2", "ieee = 1e-2, slack = 1e-5"), r"slack applies to metric 'naive_ratio' only"),
    (GOOD + "[", r"t\.toml: not valid TOML"),
])
def test_malformed_file_names_file_key_and_problem(text, message):
    with pytest.raises(budgets.BudgetError, match=message):
        parse(text)


def test_naive_ratio_bound_needs_the_naive_error():
    b = parse(GOOD.replace('"rel_rms"', '"naive_ratio"').replace("ieee = 1e-2", "ieee = 2, slack = 1e-5"))
    budget = b.get("kda", "o", "bf16", "ieee")
    assert budget.bound(3e-3) == pytest.approx(2 * 3e-3 + 1e-5)
    with pytest.raises(ValueError, match="naive_ratio needs"):
        budget.bound()


def test_missing_budget_is_a_clear_lookup_error():
    with pytest.raises(KeyError, match="no budget for kda.o.fp16"):
        parse(GOOD).get("kda", "o", "fp16", "ieee")
