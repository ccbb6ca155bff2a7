"""refcheck's own test suite. The pytest plugin (``refcheck.commands.pytest_plugin``, loaded through its
entry point once refcheck is installed) is activated at startup here, because ``tests/`` imports
Triton kernels at module level and the interpreter must be switched on before that."""


def pytest_configure(config):
    from refcheck.commands.pytest_plugin import activate
    activate(config)
