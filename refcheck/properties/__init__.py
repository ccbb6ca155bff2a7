"""The laws as pytest tests, one file per law family, each test run once per selected implementation
of every op its law concerns (``refcheck.commands.pytest_plugin``). From any folder, with refcheck installed::

    pytest --pyargs refcheck.properties --impl OP=module:callable -n auto
"""
