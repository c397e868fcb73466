"""Argument types the command line's parsers share (``privstream.cli.commands``, ``privstream.cli.run_config``):
each turns a flag's text into a value or raises ``ArgumentTypeError`` naming the bad text."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """An integer ≥ 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text}")
    return value


def positive_float(text: str) -> float:
    """A number > 0."""
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value
