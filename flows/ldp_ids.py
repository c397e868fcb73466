"""The LDP-IDS dataflow (``flows.dataflow.build`` for the ``ldp-ids`` family), e.g.::

python -m bytewax.run "privstream.flows.ldp_ids:build(dataset='sin', mechanisms='LPA', users=20000, slots=100, out='releases.jsonl')"
"""

from __future__ import annotations

from typing import Any

from bytewax.dataflow import Dataflow

from privstream.flows.dataflow import build as _build


def build(**kwargs: Any) -> Dataflow:
    """``flows.dataflow.build("ldp-ids", **kwargs)`` (a plain function: ``bytewax.run`` calls
    only functions)."""
    return _build("ldp-ids", **kwargs)
