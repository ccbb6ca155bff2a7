"""Where kernels run: the GPU when there is one, else the CPU through the faithful Triton interpreter.

Triton decides whether a kernel is interpreted when the kernel is defined, so ``configure_backend``
must run before ``optimized`` (or any other Triton kernel module) is imported; conftest and the
command line call it first thing.
"""
from __future__ import annotations

import os


def configure_backend(device: str | None = None) -> str:
    """Pick the device ("cuda" if available unless told otherwise); for the CPU, switch on the
    Triton interpreter and make it faithful (``refcheck.runtime.interpreter.enable``); for a GPU, run every
    autotuned kernel at one config drawn from the run's seed (``refcheck.runtime.autotune``, unless
    ``REFCHECK_AUTOTUNE=benchmark``). Returns the device."""
    import torch

    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device: expected 'cpu' or 'cuda', got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: 'cuda' asked for, but torch sees no CUDA device")
    from . import autotune
    autotune.mode()                      # a bad REFCHECK_AUTOTUNE fails here, before any kernel
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
        from . import interpreter
        interpreter.enable()
    else:
        from . import compile_clock
        autotune.install()
        compile_clock.install()
    return device
