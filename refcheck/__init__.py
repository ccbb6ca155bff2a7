"""refcheck: reference-vs-optimized numerical verification for attention kernels.

Layers, each importing only those below it (``tests/test_layers.py``):

    references/, optimized/, runtime/   float64 truth, our Triton kernels, where kernels run
    model/, strategies/                 cases, implementations, metrics, Hypothesis building blocks;
                                        op cards (model/ops/); registry, budgets, naive forms
    engine/                             verification, examples, laws, buckets, grid, reproducers
    commands/                           the command line, the pytest plugin, shared options
    properties/                         the laws as pytest tests
"""
__version__ = "0.1.0"
