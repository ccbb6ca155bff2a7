"""The process a candidate kernel runs in under ``refcheck verify`` (``refcheck.runtime.candidate`` starts it).

Run as a plain script (``python candidate_worker.py ADDRESS TARGET INTERPRETED``): it imports torch and the
candidate, nothing of refcheck's judge (no truth, no budgets, no laws; on the CPU, for Triton kernels, only the
faithful interpreter, ``refcheck.runtime.interpreter``), and serves the judge's requests over a connection:

    ("signature",)                                  -> the candidate's inspect.Signature, and its record: TARGET may
                                                       name an implementation record, whose own target is then
                                                       the candidate
    ("call", id, spec, tensors, grads, keep, context, keys) -> ("ok", structure, outputs, mutated) or ("error", ...)
    ("backward", id, cotangents, context)             -> ("ok", gradients) or ("error", type, text)
    ("free", id), ("exit",)

A call's tensors arrive by value (a view with its whole storage: the poisoned margins around an input travel
with it), each in the storage it had before where the judge's was the same (``keys``: ``Resident``);
``context`` carries the judge's allocation settings (``_judged``); the tensors flagged in ``grads``
require grad, and with ``keep`` the graph is kept for the backward requests of that id until it is freed.
Every output goes back by value, described so that the judge can see what the candidate returned: its class,
and which input or earlier output it shares storage with (as the offset, shape and strides of a view of it).
Inputs the call wrote into go back too, so that the judge's copies change as the candidate's did.
"""
import contextlib
import importlib
import inspect
import pickle
import sys
import traceback
from multiprocessing.connection import Client


def _describe(out, given):
    """``("tensor", k, aliasing)`` for an output tensor (k its index among the returned tensors; aliasing None or
    ``(source, index, offset, size, stride)`` with source "input" or "output"), else ``("value", out)``."""
    import torch
    if not isinstance(out, torch.Tensor):
        return ("value", out)
    aliasing = None
    if out.layout is torch.strided and out.numel():
        ptr = out.untyped_storage().data_ptr()
        for source, index, t in given:
            if t.layout is torch.strided and t.numel() and t.untyped_storage().data_ptr() == ptr \
                    and t.dtype == out.dtype:
                aliasing = (source, index, out.storage_offset() - t.storage_offset(), tuple(out.shape), out.stride())
                break
    return ("tensor", aliasing, type(out).__module__, type(out).__qualname__)


def _plain(t):
    """A tensor's values as a plain, detached tensor (no subclass travels to the judge)."""
    import torch
    if type(t) is not torch.Tensor:
        t = t.as_subclass(torch.Tensor)
    return t.detach().clone() if t.layout is torch.strided else t.detach()


@contextlib.contextmanager
def _judged(context):
    """The judge's allocation settings for one request: deterministic algorithms and PyTorch's
    ``fill_uninitialized_memory`` (the judge's poisoned allocations: an output element never written is NaN)."""
    import torch
    import torch.utils.deterministic as det
    was = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
           det.fill_uninitialized_memory)
    torch.use_deterministic_algorithms(context["deterministic"], warn_only=context["warn_only"])
    det.fill_uninitialized_memory = context["fill"]
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was[0], warn_only=was[1])
        det.fill_uninitialized_memory = was[2]


def _same_bits(a, b):
    """Whether two tensors of one shape and dtype hold the same bits (NaN equal to itself)."""
    import torch
    if a.layout is not torch.strided or not a.numel():
        return True
    return torch.equal(a.detach().contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8))


def _rebuild(spec, tensors):
    """The call's arguments: ``spec`` with its ``("tensor", i)`` slots filled from ``tensors``."""
    def fill(x):
        if isinstance(x, tuple) and len(x) == 2 and x[0] == "__tensor__":
            return tensors[x[1]]
        return x
    args, kwargs = spec
    return [fill(a) for a in args], {k: fill(v) for k, v in kwargs.items()}


class Resident:
    """The judge's addresses, kept: a tensor whose storage the judge sent before (the same address and size there)
    arrives in the storage it arrived in then, its new values copied in, so that the candidate sees one address for
    one of the judge's tensors (a result cached by address is as stale here as in the judge's process), and two
    tensors that share the judge's storage share one here. The latest ``KEPT`` storages are kept."""

    KEPT = 64

    def __init__(self):
        self.storages = {}

    def place(self, t, key):
        import torch
        received = t.untyped_storage()
        held = self.storages.pop(key, None)
        if held is None or held.nbytes() != received.nbytes():
            held = received
        elif held is not received:
            held.copy_(received)
        self.storages[key] = held
        while len(self.storages) > self.KEPT:
            self.storages.pop(next(iter(self.storages)))
        if held is received:
            return t
        return torch.empty(0, dtype=t.dtype).set_(held, t.storage_offset(), t.shape, t.stride())


def serve(conn, fn, record):
    import torch
    kept = {}
    resident = Resident()
    while True:
        msg = pickle.loads(conn.recv_bytes())
        kind = msg[0]
        try:
            if kind == "exit":
                return
            if kind == "signature":
                reply = ("ok", inspect.signature(fn), record)
            elif kind == "free":
                kept.pop(msg[1], None)
                continue
            elif kind == "call":
                _, cid, spec, tensors, grads, keep, context, keys = msg
                tensors = [resident.place(t, key) for t, key in zip(tensors, keys)]
                tensors = [t.requires_grad_() if g else t for t, g in zip(tensors, grads)]
                before = [_plain(t) for t in tensors]   # a kernel's own stores bump no version counter
                args, kwargs = _rebuild(spec, tensors)
                with torch.set_grad_enabled(keep), _judged(context):
                    result = fn(*args, **kwargs)
                flat = list(result) if isinstance(result, tuple) else [result]
                given = [("input", i, t) for i, t in enumerate(tensors)]
                structure, outputs = [], []
                for out in flat:
                    described = _describe(out, given)
                    if described[0] == "tensor":
                        given.append(("output", len(outputs), out))
                        outputs.append(out)
                    structure.append(described)
                mutated = {i: _plain(t) for i, (t, b) in enumerate(zip(tensors, before)) if not _same_bits(t, b)}
                if keep:
                    kept[cid] = (tensors, outputs)
                reply = ("ok", isinstance(result, tuple), structure, [_plain(o) for o in outputs], mutated)
            elif kind == "backward":
                _, cid, cotangents, context = msg
                tensors, outputs = kept[cid]
                pairs = [(o, c) for o, c in zip(outputs, cotangents) if c is not None and o.requires_grad]
                wrt = [t for t in tensors if t.requires_grad]
                with _judged(context):
                    grads = torch.autograd.grad([o for o, _ in pairs], wrt, [c for _, c in pairs], retain_graph=True,
                                                allow_unused=True) if pairs and wrt else [None] * len(wrt)
                it = iter(grads)
                reply = ("ok", [next(it) if t.requires_grad else None for t in tensors])
            else:
                reply = ("error", "RuntimeError", f"unknown request {kind!r}")
        except Exception as err:  # the candidate's own error, for the judge to see as raised by the call
            reply = ("error", type(err).__name__,
                     f"{err}\n" + "".join(traceback.format_exception(type(err), err, err.__traceback__, limit=-6)))
        conn.send_bytes(pickle.dumps(reply))


def main():
    address, target, interpreted = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    conn = Client(address, authkey=bytes.fromhex(sys.stdin.readline().strip()))
    if interpreted:   # Triton kernels on the CPU: the interpreter the judge's own process would run them in
        from refcheck.runtime.backend import configure_backend
        configure_backend("cpu")
    record = None
    try:
        fn = _load(target)
        if not callable(fn) and isinstance(getattr(fn, "target", None), str):   # a record naming its callable
            record, fn = fn, _load(fn.target)
        if not callable(fn):
            raise TypeError(f"{target} is a {type(fn).__name__}, not a callable")
    except Exception as err:
        conn.send_bytes(pickle.dumps(("error", type(err).__name__, str(err))))
        return
    conn.send_bytes(pickle.dumps(("ready",)))
    serve(conn, fn, record)


def _load(target):
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


if __name__ == "__main__":
    main()
