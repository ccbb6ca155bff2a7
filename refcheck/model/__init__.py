"""The model: what refcheck knows, as values. From the bottom: cases, implementations and error
metrics; the op records (``ops``: one card per op); then what reads the cards: implementations by
name (``registry``), error budgets (``budgets``, the only reader of ``tolerances.toml``) and the
naive forms (``naive``)."""
