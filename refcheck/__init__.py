"""refcheck: reference-vs-optimized numerical verification for attention kernels.

Op cards (``refcheck.ops``), implementations (``refcheck.registry``), budgets
(``refcheck.budgets``), error measures (``refcheck.metrics``) and the pipeline that joins them
(``refcheck.verify``).
"""
__version__ = "0.1.0"
