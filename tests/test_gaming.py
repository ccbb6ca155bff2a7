"""The kernels of ``tests/gaming.py`` game a check instead of computing the op; each is caught by the law it
names, with what the verdict says where the trick is more than a wrong value (an output that is an input,
a tensor subclass). Their honest twins (the naive forms, the same code without the trick) pass the same laws:
``refcheck/properties`` runs every law over them."""
from __future__ import annotations

import pytest
from hypothesis import Phase, settings

from refcheck.engine.laws import LawViolation, hypothesis_check
from refcheck.model import registry
from refcheck.strategies import profiles
from tests.gaming import HACKS

FIND = settings(**{**profiles.PROFILES["ci"], "phases": (Phase.explicit, Phase.generate), "max_examples": 30})
"""The ci profile's draws, more of them (a hack is right on some cases), stopped at the first catch."""


@pytest.mark.parametrize("name", list(HACKS))
def test_each_hack_is_caught_by_its_law(name):
    h = HACKS[name]
    with pytest.raises(LawViolation, match=f"law {h.caught_by} ") as caught:
        hypothesis_check(h.caught_by, h.impl, settings=FIND, multiple=False)
    assert h.says in str(caught.value), str(caught.value)
    assert "on valid input" not in str(caught.value), "caught by a crash of the hack, not by the law"
    assert "not returned" not in str(caught.value), "caught by a missing output or gradient, not by its trick"


@pytest.mark.parametrize("op", sorted({h.impl.op for h in HACKS.values()}))
@pytest.mark.parametrize("law", sorted({h.caught_by for h in HACKS.values()}))
def test_the_honest_form_passes_the_same_laws(op, law):
    hypothesis_check(law, registry.get(op, "naive"), settings=settings(**profiles.PROFILES["ci"]))


def test_the_harness_detector_is_wrong_outside_the_judge():
    """``attention_detects_the_harness`` returns zeros in a plain script that imports it (no refcheck laws loaded)."""
    import subprocess
    import sys
    from pathlib import Path
    code = ("import torch; from tests.gaming import attention_detects_the_harness as f; "
            "q = torch.randn(1, 4, 2, 8); o, _ = f(q, q, q); print(float(o.abs().max()))")
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parent.parent, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and float(done.stdout.split()[-1]) == 0.0, done.stderr


@pytest.mark.parametrize("name", ["attention_detects_the_harness", "attention_detects_pytest"])
def test_a_kernel_that_detects_the_harness_is_caught(capsys, name):
    """In a process of its own (``refcheck verify``'s default) the candidate sees a plain script's modules and
    environment: it gives its zeros there, and the grid catches them; run beside the judge (``--in-process``) nothing
    catches it (a pass, or where the two seconds ran out before every law, incomplete), which is why the candidate runs
    apart."""
    import json

    from refcheck.commands import cli
    runs = {}
    for where in ([], ["--in-process"]):
        code = cli.main(["verify", "attention", "--impl", f"tests.gaming:{name}", "--seconds", "2", "--forward-only",
                         "--json", *where])
        runs[bool(where)] = code, json.loads(capsys.readouterr().out)
    code, verdict = runs[False]
    assert code == 1 and verdict["verdict"] == "fail" and verdict["isolated"], verdict
    assert verdict["failures"][0]["kind"] == "grid", verdict["failures"][0]
    code, verdict = runs[True]
    assert (code, verdict["verdict"]) in ((0, "pass"), (3, "incomplete")) and not verdict["isolated"], verdict
    assert verdict["failures"] == [], verdict["failures"]


CROSSING = [name for name, h in HACKS.items() if h.says or h.caught_by != "agreement"]
"""The hacks whose evidence has to cross to the candidate's process and back (an output that is an input, a tensor
subclass, a stale buffer, a cache by address or shape); a wrong value comes back as any value does."""


@pytest.mark.parametrize("name", CROSSING)
def test_each_hack_is_caught_in_a_process_of_its_own(name):
    """The same catch with the hack run apart from the judge (``refcheck verify``'s way): the poisoned
    allocations, the poisoned margins around inputs, inputs rewritten in place and outputs that are inputs reach
    the candidate's process and come back from it."""
    import dataclasses
    h = HACKS[name]
    with pytest.raises(LawViolation, match=f"law {h.caught_by} ") as caught:
        hypothesis_check(h.caught_by, dataclasses.replace(h.impl, isolated=True), settings=FIND, multiple=False)
    assert h.says in str(caught.value), str(caught.value)
