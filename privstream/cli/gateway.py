"""``privstream gateway``: the HTTP gateway where devices fetch requests and post reports
(``privstream.runtime.gateway``; needs the ``gateway`` extra)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from privstream.cli.argtypes import positive_float, positive_int


def add_parser(commands: Any, kafka_flags: Callable[..., None]) -> None:
    gw = commands.add_parser(
        "gateway",
        help="serve devices over HTTP: GET /v1/requests, POST /v1/reports, GET /healthz "
        "(run it behind TLS termination; docs/gateway.md)",
    )
    kafka_flags(gw, required=True)
    gw.add_argument("--request-topic", required=True, help="topic the server writes requests to")
    gw.add_argument("--report-topic", required=True, help="topic accepted reports are written to")
    gw.add_argument("--host", default="127.0.0.1", help="listen address (default %(default)s)")
    gw.add_argument("--port", type=positive_int, default=8080, help="port (default %(default)s)")
    gw.add_argument(
        "--rate-window", type=positive_int, default=10, metavar="SLOTS",
        help="the per-device rate limit's window in slots (default %(default)s)",
    )  # fmt: skip
    gw.add_argument(
        "--rate-limit", type=positive_int, default=100, metavar="N",
        help="most reports one device may send per stream in --rate-window slots; at least "
        "rounds x purposes x w so an honest device never reaches it (default %(default)s)",
    )  # fmt: skip
    gw.add_argument(
        "--max-body-bytes", type=positive_int, default=1 << 20,
        help="largest POST body (default %(default)s); larger is 413",
    )  # fmt: skip
    gw.add_argument(
        "--delivery-timeout", type=positive_float, default=30.0, metavar="S",
        help="seconds to wait for the broker's confirmation before answering 503",
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted; refuse with a one-line error without the ``gateway`` extra."""
    from privstream.connectors.kafka import KafkaSettings
    from privstream.extras import require

    require("gateway", ("aiohttp",), "privstream gateway")
    from privstream.runtime.gateway import serve

    serve(KafkaSettings.from_options(args.bootstrap, args.kafka_config), args)
    return 0
