"""The personalized w-event dataflow (``flows.dataflow.build`` for the ``personalized``
family), e.g.::

    python -m bytewax.run "privstream.flows.personalized:build(dataset='sin', mechanisms='PBD,BD', budget_split='equal', users=20000, slots=300, out='releases.jsonl')"
"""

from __future__ import annotations

from typing import Any

from bytewax.dataflow import Dataflow

from privstream.flows.dataflow import build as _build


def build(**kwargs: Any) -> Dataflow:
    """``flows.dataflow.build("personalized", **kwargs)`` (a plain function: ``bytewax.run`` calls
    only functions)."""
    return _build("personalized", **kwargs)
