"""Where kernels run (the bottom layer): the backend (GPU, or the CPU through the faithful Triton
interpreter), the interpreter itself, the compiler's front end run on captured launches without a GPU,
autotuned kernels pinned to one config on a GPU run, the compile clock, and the worker processes that run
a grid's units."""
