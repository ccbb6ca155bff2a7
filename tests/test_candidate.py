"""``refcheck.runtime.candidate``: a kernel run in a process of its own gives the judge what it would have seen
in its own process: the same values and gradients, the candidate's errors as raised, inputs written in place
written in the judge's copies, an output that is an input (or a view of one) sharing the judge's storage, a
tensor subclass of its class name; and the process has a plain script's environment."""
from __future__ import annotations

import pytest
import torch

from refcheck import references
from refcheck.runtime import candidate

HERE = "tests.test_candidate"


def returns_its_input(q, k, v, **options):
    return q, None


def returns_a_view(q, k, v, **options):
    return q[:, 1:], q.sum()


class Marked(torch.Tensor):
    pass


def returns_a_subclass(q, k, v, **options):
    return (q * 2).as_subclass(Marked), None


def writes_into_k(q, k, v, **options):
    k.mul_(2)
    return q + 1, None


def refuses(q, k, v, **options):
    raise ValueError("q: expected something else")


def environment_of(q, k, v, **options):
    """1 where a variable of pytest or Hypothesis, or refcheck's judge, is visible to the kernel."""
    import os
    import sys
    seen = [any(n.startswith(p) for n in os.environ) for p in ("PYTEST", "HYPOTHESIS", "REFCHECK")]
    seen.append(any(m.startswith(("refcheck.engine", "refcheck.model", "hypothesis")) for m in sys.modules))
    return torch.tensor(seen, dtype=torch.float32), None


def inputs(dtype=torch.float64, grad=False):
    gen = torch.Generator().manual_seed(0)
    x = [torch.randn(1, 6, h, 8, generator=gen, dtype=dtype) for h in (2, 1, 1)]
    return [t.requires_grad_(grad) for t in x]


def test_values_and_gradients_are_the_in_process_ones():
    fn = candidate.isolated("refcheck.references:attention", False)
    q, k, v = inputs(grad=True)
    o, lse = fn(q, k, v, causal=True)
    ro, rlse = references.attention(q, k, v, causal=True)
    assert torch.equal(o, ro) and torch.equal(lse, rlse) and type(o) is torch.Tensor
    gen = torch.Generator().manual_seed(1)
    do, dl = torch.randn(o.shape, generator=gen, dtype=o.dtype), torch.randn(lse.shape, generator=gen, dtype=o.dtype)
    got = torch.autograd.grad((o, lse), (q, k, v), (do, dl))
    want = torch.autograd.grad((ro, rlse), (q, k, v), (do, dl))
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert list(__import__("inspect").signature(fn).parameters)[:3] == ["q", "k", "v"]


def test_errors_come_back_as_raised():
    with pytest.raises(ValueError, match="q: expected something else"):
        candidate.isolated(f"{HERE}:refuses", False)(*inputs())


def test_aliasing_and_subclasses_come_back_as_the_judge_would_see_them():
    q, k, v = inputs()
    o, _ = candidate.isolated(f"{HERE}:returns_its_input", False)(q, k, v)
    assert o.untyped_storage().data_ptr() == q.untyped_storage().data_ptr() and torch.equal(o, q)
    view, total = candidate.isolated(f"{HERE}:returns_a_view", False)(q, k, v)
    assert view.untyped_storage().data_ptr() == q.untyped_storage().data_ptr() and torch.equal(view, q[:, 1:])
    assert total.untyped_storage().data_ptr() != q.untyped_storage().data_ptr()
    o, _ = candidate.isolated(f"{HERE}:returns_a_subclass", False)(q, k, v)
    assert type(o) is not torch.Tensor and type(o).__qualname__ == "Marked" and type(o).__module__ == HERE
    assert torch.equal(o.as_subclass(torch.Tensor), q * 2)


def test_inputs_written_in_place_are_written_in_the_judges_copies():
    q, k, v = inputs()
    before = k.clone()
    candidate.isolated(f"{HERE}:writes_into_k", False)(q, k, v)
    assert torch.equal(k, 2 * before)


def test_the_process_has_a_plain_scripts_environment(monkeypatch):
    monkeypatch.setenv("HYPOTHESIS_PROFILE", "ci")
    monkeypatch.setenv("REFCHECK_FAILURE_DIR", "/tmp")
    assert not any(n.startswith(candidate.HIDDEN) for n in candidate.worker_environment())
    seen, _ = candidate.isolated(f"{HERE}:environment_of", False)(*inputs())
    # pytest's own variables are hidden; the test module itself imports pytest and refcheck.runtime, not the judge
    assert seen.tolist() == [0.0, 0.0, 0.0, 0.0], seen
