"""Read privstream's Grafana dashboard back: its queries, instantiated for a plain Prometheus.

``panel_queries`` lists every target's PromQL with its panel's title, rows and the panels
nested in collapsed rows included; ``instantiate`` substitutes Grafana's template variables
(``$stream``, ``$mechanism``, ``$__rate_interval``, ``$__interval``, ``$__range``) so that the
query can be run by Prometheus itself (``/api/v1/query``) or parsed by ``promtool``.
``load_generator`` imports ``deploy/grafana/generate.py``, which is a script, not a package
module.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARD = GRAFANA / "privstream-dashboard.json"
GENERATOR = GRAFANA / "generate.py"

# $name, ${name} and ${name:format}
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")


def load_dashboard(path: Path = DASHBOARD) -> dict[str, Any]:
    """The committed dashboard JSON."""
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def load_generator() -> ModuleType:
    """``deploy/grafana/generate.py`` as a module (it needs ``grafana_foundation_sdk``)."""
    name = "privstream_dashboard_generate"
    spec = importlib.util.spec_from_file_location(name, GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def rows(dashboard: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every non-row panel with the title of the row it belongs to (``""`` before the first
    row); a collapsed row keeps its panels in its own ``panels``, an expanded one is followed
    by them."""
    row = ""
    for panel in dashboard.get("panels", ()):
        if panel.get("type") == "row":
            row = str(panel.get("title", ""))
            for nested in panel.get("panels", ()):
                yield row, nested
        else:
            yield row, panel


def panel_queries(dashboard: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(panel title, expr)`` of every target of every panel, in layout order."""
    return [
        (str(panel.get("title", "")), str(target["expr"]))
        for _, panel in rows(dashboard)
        for target in panel.get("targets", ())
        if "expr" in target
    ]


def _literal(value: str) -> str:
    """``value`` escaped for a PromQL double-quoted string (Grafana's variables always sit in
    one: ``stream=~"$stream"``)."""
    return value.replace("\\", "\\\\").replace('"', '\\"')


def instantiate(
    expr: str,
    stream_regex: str = ".+",
    mechanism_regex: str = ".+",
    rate_interval: str = "1m",
    *,
    interval: str | None = None,
    range_: str = "6h",
) -> str:
    """``expr`` with Grafana's variables replaced, ready for a Prometheus instant query.

    ``$stream`` and ``$mechanism`` (also ``${stream}``, ``${stream:regex}``) become the given
    regexes, escaped for the string literal they sit in; ``$__rate_interval`` becomes
    ``rate_interval``, ``$__interval`` ``interval`` (default: ``rate_interval``) and
    ``$__range`` ``range_`` (the dashboard's 6 h by default). Any other variable raises
    ``ValueError``: a query Prometheus could not run unchanged.
    """
    values = {
        "stream": _literal(stream_regex),
        "mechanism": _literal(mechanism_regex),
        "__rate_interval": rate_interval,
        "__interval": interval if interval is not None else rate_interval,
        "__range": range_,
    }

    def substitute(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in values:
            raise ValueError(f"unknown dashboard variable ${name} in {expr!r}")
        return values[name]

    return _VARIABLE.sub(substitute, expr)
