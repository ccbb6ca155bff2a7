"""PLACEHOLDER by the drift agent (to be replaced by the real module; delete if still here)."""


def add_parser(subparsers) -> None:
    pass
