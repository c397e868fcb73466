"""The ``privstream`` command line (the console script): ``main`` parses and dispatches."""

from privstream.cli.commands import main

__all__ = ["main"]
