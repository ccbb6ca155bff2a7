"""Budget files: the shipped defaults load and cover every op output with a contract bound; entries
are one key per line with structured measurements; user files layer over the defaults; malformed
files fail with the file, the key and the problem; every bound says what it is made of."""
import pytest

from refcheck.model import budgets
from refcheck.model.case import PRECISION_MODES
from refcheck.model.ops import OPS
from refcheck.model.ops.attention import FP8_DTYPES

GOOD = '''
[kda.o.bf16]
metric = "naive_ratio"
ieee = 3
tf32 = 3
tf32x3 = 3
slack = 1e-3
reason = "the contract bound"
measured = { worst = 0.9, draws = 400, of = "naive_chunked", case = "bf16 B=1,H=1,K=8,T=65,V=8" }

[kda.o.bf16.triton]
metric = "rel_rms"
ieee = 1e-2
tf32 = 1e-2
tf32x3 = 1e-2
reason = "our kernel measured 3e-3"
'''
OUTPUTS = {name: card.budget_outputs for name, card in OPS.items()}


def parse(text: str):
    return budgets.parse(text, "t.toml", OUTPUTS)


def test_shipped_defaults_cover_every_output_with_a_contract_bound():
    loaded = budgets.load()
    for name, op in OPS.items():
        for output in op.budget_outputs:
            for dtype in ("fp32", "bf16", "fp16"):
                for mode in PRECISION_MODES:
                    b = loaded.get(name, output, dtype, mode, impl="someone:else")
                    assert b.metric == "naive_ratio" and not b.guard and b.value > 0 and b.reason
    assert budgets.DEFAULT_PATH.name == "tolerances.toml" and budgets.DEFAULT_PATH.parent.name == "refcheck"


def test_shipped_fp8_attention_budgets_give_a_contract_bound_and_our_guard():
    loaded = budgets.load()
    for fp8 in FP8_DTYPES:
        for output in ("o", "lse"):
            contract = loaded.get("attention", output, fp8, "tf32", impl="someone:else")
            guard = loaded.get("attention", output, fp8, "tf32", impl="triton")
            assert contract.metric == "naive_ratio" and not contract.guard and guard.guard and guard.metric == "rel_rms"


def test_every_line_of_the_shipped_file_is_short_or_a_reason():
    for line in budgets.DEFAULT_PATH.read_text().splitlines():
        if not line.startswith(("reason", "measured", "#")):
            assert len(line) <= 100, line


def test_contract_bound_and_guard():
    b = parse(GOOD)
    contract = b.get("kda", "o", "bf16", "tf32", impl="mykernels:chunk_kda")
    assert contract.key == "kda.o.bf16" and contract.bound(4.5e-2) == pytest.approx(3 * 4.5e-2 + 1e-3)
    assert contract.explain(4.5e-2, "chunked", "bf16") == \
        "3 x the bf16 naive error on this case (chunked form), 4.5e-02, + 1e-03 [kda.o.bf16, t.toml]"
    guard = b.get("kda", "o", "bf16", "tf32", impl="triton")
    assert guard.guard and guard.bound() == 1e-2 and guard.explain() == "fixed 0.01 [kda.o.bf16.triton guard, t.toml]"
    assert b.flat()["kda.o.bf16"]["measured"]["draws"] == 400


def test_slack_per_mode():
    text = GOOD.replace("slack = 1e-3", "slack = { ieee = 1e-6, tf32 = 5e-3, tf32x3 = 1e-6 }")
    b = parse(text)
    assert b.get("kda", "o", "bf16", "tf32").slack == 5e-3 and b.get("kda", "o", "bf16", "ieee").slack == 1e-6


def test_user_files_layer_over_the_defaults(tmp_path, monkeypatch):
    monkeypatch.delenv(budgets.ENV, raising=False)
    mine = tmp_path / "mine.toml"
    mine.write_text('[simple_gla.o.fp32."mykernels:fn"]\nmetric = "rel_rms"\nieee = 1e-7\ntf32 = 1e-3\n'
                    'tf32x3 = 1e-7\nreason = "my kernel, measured 3e-8"\n')
    layered = budgets.use([mine])
    try:
        mine_guard = layered.get("simple_gla", "o", "fp32", "ieee", impl="mykernels:fn")
        assert mine_guard.value == 1e-7
        assert mine_guard.explain() == "fixed 1e-07 [simple_gla.o.fp32.mykernels:fn guard, mine.toml]"
        assert layered.get("simple_gla", "o", "fp32", "ieee", impl="other").metric == "naive_ratio"
        assert budgets.load() is layered and budgets.user_paths() == (str(mine.resolve()),)
    finally:
        budgets.use([])
    assert budgets.user_paths() == ()
    with pytest.raises(budgets.BudgetError, match="no such file"):
        budgets.use([tmp_path / "missing.toml"])


@pytest.mark.parametrize("text, message", [
    (GOOD.replace("[kda.o.bf16]", "[kdaa.o.bf16]"), r"t\.toml: \[kdaa\] unknown op"),
    (GOOD.replace("tf32x3 = 3\n", "", 1), r"t\.toml: \[kda\.o\.bf16\] missing mode 'tf32x3'"),
    (GOOD.replace("ieee = 3", "ieeee = 3", 1), r"t\.toml: \[kda\.o\.bf16\] unknown key\(s\) \['ieeee'\]"),
    (GOOD.replace("ieee = 3", "ieee = -3", 1), r"t\.toml: \[kda\.o\.bf16\] ieee must be positive"),
    (GOOD.replace("ieee = 3", "ieee = 0", 1), r"t\.toml: \[kda\.o\.bf16\] ieee must be positive"),
    (GOOD.replace('"naive_ratio"', '"naive_ratios"'), r"\[kda\.o\.bf16\] bad metric name 'naive_ratios'"),
    (GOOD.replace('reason = "the contract bound"\n', ""), r"t\.toml: \[kda\.o\.bf16\] missing reason"),
    (GOOD.replace("[kda.o.bf16]", "[kda.dz.bf16]"), r"t\.toml: \[kda\.dz\] unknown output"),
    (GOOD.replace("[kda.o.bf16]", "[kda.o.bf17]"), r"t\.toml: \[kda\.o\.bf17\] unknown dtype"),
    (GOOD.replace("[kda.o.bf16]", "[kda.o.fp8]"), r"t\.toml: \[kda\.o\.fp8\] unknown dtype"),
    (GOOD.replace("ieee = 3", 'ieee = "3"', 1), r"ieee must be a finite number"),
    (GOOD.replace("ieee = 3", "ieee = inf", 1), r"ieee must be a finite number"),
    (GOOD.replace("ieee = 1e-2", "ieee = 1e-2\nslack = 1e-5"), r"slack applies to metric 'naive_ratio' only"),
    (GOOD.replace("slack = 1e-3", "slack = { ieee = 1e-6 }"), r"slack: a table gives exactly the modes"),
    (GOOD.replace("draws = 400", "draws = 4.5"), r"measured\.draws: wrong type float"),
    (GOOD.replace("draws = 400", "drawz = 400"), r"measured: unknown field 'drawz'"),
    (GOOD + "[", r"t\.toml: not valid TOML"),
])
def test_malformed_file_names_file_key_and_problem(text, message):
    with pytest.raises(budgets.BudgetError, match=message):
        parse(text)


def test_an_incomplete_defaults_file_is_refused(tmp_path, monkeypatch):
    partial = tmp_path / "tolerances.toml"
    partial.write_text(GOOD)
    monkeypatch.setattr(budgets, "DEFAULT_PATH", partial)
    with pytest.raises(budgets.BudgetError, match="no contract bound for (.*, )?kda_gate.gate.fp32"):
        budgets.load()


def test_missing_budget_is_a_clear_lookup_error():
    with pytest.raises(KeyError, match="no budget for kda.o.fp16"):
        parse(GOOD).get("kda", "o", "fp16", "ieee")


def test_contract_bound_measurement_runs(tmp_path):
    """``benchmarks/contract_bounds.py``, what the contract factors rest on, runs against today's registry (it once
    raised AttributeError on an implementation attribute that had moved): two draws of torch SDPA, a ratio to the naive
    error for every attention output it returns."""
    import json
    import subprocess
    import sys
    from pathlib import Path
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "contract_bounds.py"
    out = tmp_path / "bounds.json"
    run = subprocess.run([sys.executable, str(script), "--draws", "2", "--impl", "sdpa", "--out", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode in (0, 1), run.stderr[-2000:]
    rows = json.loads(out.read_text())["worst"]
    assert {key.split(".")[1] for key in rows} >= {"o", "dq", "dk", "dv"}
    assert all(row["draws"] >= 1 and row["of"] == ["sdpa"] for row in rows.values())
