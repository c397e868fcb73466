"""Exceptions shared by every mechanism family."""

from __future__ import annotations


class PrivacyBudgetExceeded(RuntimeError):
    """A ledger charge would break the mechanism's privacy invariant (design §3).

    Raised *before* anything derived from the charge is released. The stream that raised it
    must stop: the operator never swallows it and continues.
    """


class IncompatibleState(RuntimeError):
    """A snapshot's state version does not match the code restoring it (design §6)."""
