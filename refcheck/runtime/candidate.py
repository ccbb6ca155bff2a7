"""A candidate kernel in a process of its own: the judge (``refcheck verify``) never runs it in its own process.

``isolated(target)`` is a callable with the candidate's signature that sends each call's tensors to a worker
process (``candidate_worker.py``, started once per target and judge process) and returns its outputs, so that
the laws, the truth and the budgets stay in the judge's process and the candidate sees the environment of a plain
script: no pytest, Hypothesis or refcheck variables (``HIDDEN``), none of refcheck's judge imported (on the CPU,
for Triton kernels, the faithful interpreter only: ``refcheck.runtime.interpreter``). What the candidate returned is
rebuilt as the judge would have seen it: an output of a tensor subclass comes back of a class of that name, an
output that shares storage with an input (or an earlier output) comes back as a view of the judge's own tensor, and
inputs the candidate wrote into are written in the judge's copies, so that the contract's checks and the laws read
the same evidence. Gradients flow through an autograd function whose backward asks the worker for the vector-Jacobian
products of the kept graph. CPU tensors only (the judge runs on the CPU).
"""
from __future__ import annotations

import atexit
import builtins
import itertools
import os
import pickle
import secrets
import subprocess
import sys
import weakref
from multiprocessing.connection import Listener
from pathlib import Path

import torch

WORKER = Path(__file__).with_name("candidate_worker.py")
HIDDEN = ("PYTEST", "_PYTEST", "HYPOTHESIS", "REFCHECK", "COV_CORE", "PYTHONBREAKPOINT")
"""Prefixes of the environment variables the candidate's process does not get."""
START_SECONDS = 120
"""How long the worker may take to connect (it imports torch and the candidate first)."""


class CandidateError(RuntimeError):
    """The candidate's process failed (it died, or could not import the candidate)."""


def worker_environment() -> dict[str, str]:
    """The judge's environment without ``HIDDEN``'s variables, with the judge's import path (the candidate's
    module is found where the judge found it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(HIDDEN)}
    paths = [p for p in sys.path if p and Path(p).exists()]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([str(Path.cwd()), *paths]))
    return env


class Candidate:
    """One worker process serving one target."""

    def __init__(self, target: str, interpreted: bool):
        key = secrets.token_bytes(16)
        self.listener = Listener(family="AF_UNIX", authkey=key)
        self.process = subprocess.Popen([sys.executable, str(WORKER), str(self.listener.address), target,
                                         "1" if interpreted else "0"], stdin=subprocess.PIPE, stdout=2,
                                        env=worker_environment(), text=True)
        assert self.process.stdin is not None
        self.process.stdin.write(key.hex() + "\n")
        self.process.stdin.close()
        sock = getattr(getattr(self.listener, "_listener", None), "_socket", None)
        if sock is not None:            # a worker that dies before it connects: an error, not a hang
            sock.settimeout(START_SECONDS)
        try:
            self.conn = self.listener.accept()
        finally:
            self.listener.close()       # one connection, the worker's
        self.target = target
        reply = self._receive()
        if reply[0] != "ready":
            self.close()
            raise CandidateError(f"{target}: its process could not load it: {reply[1]}: {reply[2]}")
        self.ids = itertools.count()

    def _receive(self):
        try:
            return pickle.loads(self.conn.recv_bytes())
        except (EOFError, OSError):
            code = self.process.wait(timeout=10)
            raise CandidateError(f"{self.target}: its process died (exit status {code})") from None

    def request(self, *msg):
        self.conn.send_bytes(pickle.dumps(msg))
        return self._receive()

    def free(self, cid: int) -> None:
        if self.process.poll() is None:
            try:
                self.conn.send_bytes(pickle.dumps(("free", cid)))
            except OSError:
                pass

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.conn.send_bytes(pickle.dumps(("exit",)))
                self.process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
        self.conn.close()


_processes: dict[tuple[str, bool], Candidate] = {}


def _candidate(target: str, interpreted: bool) -> Candidate:
    key = (target, interpreted)
    found = _processes.get(key)
    if found is None or found.process.poll() is not None:
        found = _processes[key] = Candidate(target, interpreted)
    return found


@atexit.register
def _close_all() -> None:
    for candidate in _processes.values():
        candidate.close()


def _raise(kind: str, text: str):
    """Raise the candidate's error in the judge: a builtin exception class as itself, others as RuntimeError
    naming it."""
    cls = getattr(builtins, kind, None)
    if isinstance(cls, type) and issubclass(cls, Exception):
        raise cls(text)
    raise RuntimeError(f"{kind}: {text}")


_foreign: dict[tuple[str, str], type] = {}


def _of_class(t: torch.Tensor, module: str, qualname: str) -> torch.Tensor:
    """``t`` as an instance of a tensor class named as the candidate's was (the contract's plain-tensor check
    names it), plain where the candidate's was plain."""
    if (module, qualname) == ("torch", "Tensor"):
        return t
    cls = _foreign.get((module, qualname))
    if cls is None:
        cls = _foreign[(module, qualname)] = type(qualname.rpartition(".")[2], (torch.Tensor,),
                                                  {"__module__": module, "__qualname__": qualname})
    return t.as_subclass(cls)


def _keys(tensors: list[torch.Tensor]) -> list[tuple[int, int]]:
    """Each tensor's storage as the judge holds it (address, bytes): the candidate's process keeps one storage per
    key (``candidate_worker.Resident``)."""
    return [(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()) for t in tensors]


def _context() -> dict:
    """The judge's allocation settings that the candidate's process applies for a request: deterministic
    algorithms and ``fill_uninitialized_memory`` (``refcheck.engine.laws.poisoned_allocations``)."""
    import torch.utils.deterministic as det
    return {"deterministic": torch.are_deterministic_algorithms_enabled(),
            "warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
            "fill": det.fill_uninitialized_memory}  # type: ignore[attr-defined]


def _split(args, kwargs):
    """``(spec, tensors)``: the call's arguments with each tensor replaced by a slot, and the tensors."""
    tensors: list[torch.Tensor] = []

    def slot(x):
        if isinstance(x, torch.Tensor):
            tensors.append(x)
            return ("__tensor__", len(tensors) - 1)
        return x
    return ([slot(a) for a in args], {k: slot(v) for k, v in kwargs.items()}), tensors


def _outputs(reply, tensors: list[torch.Tensor]):
    """The call's result as the candidate returned it (``candidate_worker``'s description), from the worker's
    values and the judge's own tensors."""
    _, was_tuple, structure, values, mutated = reply
    with torch.no_grad():
        for i, value in mutated.items():
            tensors[i].copy_(value)
    outs: list = []
    built: list[torch.Tensor] = []
    for entry in structure:
        if entry[0] == "value":
            outs.append(entry[1])
            continue
        _, aliasing, module, qualname = entry
        value = values[len(built)]
        if aliasing is not None:
            source, index, offset, size, stride = aliasing
            base = tensors[index] if source == "input" else built[index]
            value = base.as_strided(size, stride, base.storage_offset() + offset)
        value = _of_class(value, module, qualname)
        built.append(value)
        outs.append(value)
    return tuple(outs) if was_tuple else outs[0]


class _Call(torch.autograd.Function):
    """A call with tensors that require grad: forward in the worker (graph kept), backward by its VJP."""

    @staticmethod
    def forward(ctx, candidate, spec, grads, shape, *tensors):
        cid = next(candidate.ids)
        reply = candidate.request("call", cid, spec, [t.detach() for t in tensors], grads, True, _context(),
                                  _keys(tensors))
        if reply[0] == "error":
            candidate.free(cid)
            _raise(reply[1], reply[2])
        result = _outputs(reply, list(tensors))
        flat = list(result) if isinstance(result, tuple) else [result]
        ctx.candidate, ctx.cid = candidate, cid
        shape["was_tuple"] = isinstance(result, tuple)
        shape["flat"] = [None if isinstance(x, torch.Tensor) else ("value", x) for x in flat]
        outs = [x for x in flat if isinstance(x, torch.Tensor)]
        weakref.finalize(ctx, candidate.free, cid)      # the worker's graph lives as long as this node of ours
        ctx.mark_non_differentiable(*[o for o in outs if not o.is_floating_point()])
        return tuple(outs)

    @staticmethod
    def backward(ctx, *cotangents):
        reply = ctx.candidate.request("backward", ctx.cid, list(cotangents), _context())
        if reply[0] == "error":
            _raise(reply[1], reply[2])
        return (None, None, None, None, *reply[1])


def isolated(target: str, interpreted: bool):
    """A callable that runs ``target`` (``module:callable``) in a candidate process, with its signature; where
    ``target`` names an implementation record (``refcheck.model.registry.Implementation``), the record's own
    target runs, and the record is the callable's ``record`` (else None)."""
    candidate = _candidate(target, interpreted)
    reply = candidate.request("signature")
    if reply[0] == "error":
        _raise(reply[1], reply[2])

    def call(*args, **kwargs):
        spec, tensors = _split(args, kwargs)
        grads = [t.requires_grad for t in tensors]
        live = _candidate(target, interpreted)
        if torch.is_grad_enabled() and any(grads):
            shape: dict = {}     # what forward saw: the non-tensor outputs (None for a final state not asked for)
            outs = iter(_Call.apply(live, spec, grads, shape, *tensors))
            flat = [next(outs) if entry is None else entry[1] for entry in shape["flat"]]
            return tuple(flat) if shape["was_tuple"] else flat[0]
        reply = live.request("call", next(live.ids), spec, [t.detach() for t in tensors], grads, False, _context(),
                             _keys(tensors))
        if reply[0] == "error":
            _raise(reply[1], reply[2])
        return _outputs(reply, tensors)

    call.__signature__ = reply[1]          # type: ignore[attr-defined]
    call.record = reply[2]                 # type: ignore[attr-defined]  # the record TARGET named, or None
    call.__name__ = target.partition(":")[2]
    call.__qualname__ = call.__name__
    call.__module__ = target.partition(":")[0]
    call.__doc__ = f"{target}, run in a process of its own (refcheck.runtime.candidate)"
    return call


def interpreted_here() -> bool:
    """Whether this process runs Triton kernels in the interpreter (the CPU backend)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


