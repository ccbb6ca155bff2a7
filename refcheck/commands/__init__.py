"""The commands: the command line (``cli``; ``report``, ``drift``, ``fuzz``, ``budgets diff``), the
pytest plugin, and the options they all share (``selection``)."""
