"""The LDP-IDS dataflow (``flows.dataflow.build`` for the ``ldp-ids`` family), e.g.::

python -m bytewax.run "privstream.flows.ldp_ids:build(dataset='sin', mechanisms='LPA', users=20000, slots=100, out='releases.jsonl')"
"""

from __future__ import annotations

import functools

from privstream.flows.dataflow import build as _build

build = functools.partial(_build, "ldp-ids")
