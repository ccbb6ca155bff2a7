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
