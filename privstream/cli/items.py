"""``privstream items``: records of named items as events over a public item dictionary
(``connectors.item_dictionary``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def add_parser(commands: Any) -> None:
    items = commands.add_parser(
        "items",
        help="turn records (user, item, slot|ts) into events over a public item dictionary",
    )
    items.add_argument("records", type=Path, help="CSV (with a header) or JSON-lines records")
    items.add_argument(
        "--dictionary", type=Path, required=True,
        help="the public item dictionary: one label per line, in category order",
    )  # fmt: skip
    items.add_argument("--out", type=Path, required=True, help="events as JSON lines")
    items.add_argument(
        "--item-field", default="item", help="the records' item field (default item)"
    )
    items.add_argument("--stream", help="the events' stream (default: each record's, else items)")
    items.add_argument(
        "--other", action="store_true",
        help="unknown items become one extra category k (the domain is then k+1) instead of "
        "being dropped",
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """Write the events; say on stderr how many, the domain to run with, and what was dropped
    (counts only: no label, no user)."""
    from privstream.connectors.item_dictionary import ItemDictionary, encode, read_records

    items = ItemDictionary.from_file(args.dictionary, other=args.other)
    events, tally = encode(read_records(args.records), items, args.item_field, args.stream)
    with open(args.out, "w", encoding="utf-8") as f:
        for event in events:
            f.write(json.dumps(event, separators=(",", ":")) + "\n")
    dropped = ", ".join(f"{reason}: {n}" for reason, n in sorted(tally.dropped.items()))
    print(
        f"wrote {tally.events} events to {args.out}; run with --domain {items.domain}"
        + (f"; dropped {sum(tally.dropped.values())} records ({dropped})" if dropped else ""),
        file=sys.stderr,
    )
    return 0 if tally.events else 1
