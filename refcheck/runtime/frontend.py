"""What the Triton compiler says of a kernel before any GPU runs it: launches captured on the CPU, each
specialized as a GPU launch would be and put through the compiler's front end (Python AST to Triton IR).

The faithful interpreter (``interpreter``) runs a kernel's Python and checks what it computes; it does
not type the program as the compiler does. A kernel it runs can still be refused on the GPU, e.g. a
loop-carried tile whose dtype changes inside the loop ("Loop-carried variable span has initial type
fp32 but is re-assigned to fp64": KDA's intra pass with fp32 inputs, whose cumulative gate is fp64,
found by a GPU law run on an H100 that lost 17 examples to it). The front end alone takes 0.01-0.12 s a
launch on the CPU, with no GPU and no ptxas.

    launches = capture(lambda: optimized.kda(...).sum().backward())    # recorded, not run
    for kernel, constexprs, error in frontend_errors(launches): ...

Kernels must be compiled ones (``TRITON_INTERPRET`` unset when their module was imported): run this in
a process of its own, as ``tests/test_frontend.py`` and ``benchmarks/kernel_resources.py`` do. Uses
Triton's launch binder and ``ASTSource.make_ir`` (checked on triton 3.6 and 3.9).
"""
from __future__ import annotations

from collections.abc import Callable
from unittest import mock


def capture(fn: Callable[[], object], refuse: Callable | None = None) -> list[tuple]:
    """Call ``fn()`` with Triton launches recorded, not run: ``[(kernel, bound arguments, options)]``.
    Outputs are never written, so ``fn`` may fail on them; the launches up to there are returned.
    ``refuse(kernel, bound, options)``: the shared memory a launch needs where it exceeds the GPU's
    (else None); such a launch is recorded with ``options["refused"]`` and raises ``OutOfResources``, so
    that the launch ladders (``optimized.common.launch``) fall back as on that GPU."""
    from triton.runtime.errors import OutOfResources
    from triton.runtime.jit import JITFunction

    from . import interpreter
    seen = []

    def record(self, *args, grid, warmup, **kwargs):
        names = [p.name for p in self.params]
        bound = dict(zip(names, args)) | {n: v for n, v in kwargs.items() if n in names}
        options = {n: v for n, v in kwargs.items() if n not in names}
        needed = refuse(self, bound, options) if refuse is not None else None
        if needed is not None:
            seen.append((self, bound, options | {"refused": needed}))
            raise OutOfResources(needed, 0, "shared memory")
        seen.append((self, bound, options))
    # the kernels' CPU-device check (``optimized.common.check_runs_on``) must let the recorded launches be
    with mock.patch.object(JITFunction, "run", record), mock.patch.object(interpreter, "is_interpreted", lambda k: True), \
            mock.patch.object(interpreter, "enable", lambda: None):
        try:
            fn()
        except Exception:  # outputs were never written; the launches up to here are what we want
            pass
    return seen


def specialize(kernel, bound: dict, options: dict, arch: int = 90):
    """``(signature, constexprs, attrs, options)`` of one launch as ``JITFunction.run`` builds them: Triton's
    own binder specializes each argument the way the GPU launch would (pointers of 16-byte aligned
    tensors and ints divisible by 16 get ``tt.divisibility = 16``, an int equal to 1 becomes a
    constexpr), so the compiler sees what it will see there."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature
    backend = make_backend(GPUTarget("cuda", arch, 32))
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    kwargs = {k: v for k, v in options.items() if k in ("num_warps", "num_stages", "maxnreg")}
    bound_args, specialization, _ = binder(**bound, **kwargs)
    _, sig, consts, attrs = kernel._pack_args(backend, kwargs, bound_args, specialization, kwargs)
    return sig, consts, attrs, kwargs


def constexprs(kernel, bound: dict) -> dict:
    """The launch's constexpr arguments by name (a default where the launch leaves one out)."""
    return {p.name: bound.get(p.name, p.default) for p in kernel.params if p.is_constexpr}


def frontend_errors(launches: list[tuple], arch: int = 90) -> list[tuple[str, dict, str]]:
    """``[(kernel name, constexprs, error)]`` for each distinct launch of ``launches`` that the compiler's
    front end refuses for ``sm_<arch>``."""
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    errors, done = [], set()
    for kernel, bound, options in launches:
        if "refused" in options:
            continue
        sig, consts, attrs, opts = specialize(kernel, bound, options, arch)
        key = (kernel.fn, repr(sorted(sig.items())), repr(sorted(consts.items())), repr(sorted(opts.items())))
        if key in done:
            continue
        done.add(key)
        parsed = backend.parse_options(opts)
        context = ir.context()
        ir.load_dialects(context)
        backend.load_dialects(context)
        try:
            ASTSource(kernel, sig, constexprs=consts, attrs=attrs).make_ir(
                target, parsed, backend.get_codegen_implementation(parsed), backend.get_module_map(), context)
        except Exception as err:  # CompilationError, with the kernel's source line
            errors.append((kernel.fn.__name__, constexprs(kernel, bound), f"{type(err).__name__}: {err}"))
    return errors
