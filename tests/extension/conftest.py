"""Fixtures of the worked example: ``site/`` (another distribution's modules and metadata) on
the import path of this process and of the subprocesses it starts."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from privstream.families import registry

SITE = Path(__file__).resolve().parent / "site"


@pytest.fixture
def external_site(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """``site/`` on ``sys.path`` with discovery forgotten before and after; yields the
    environment a subprocess needs to discover the same families."""
    registry.families.cache_clear()
    monkeypatch.syspath_prepend(str(SITE))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SITE), env.get("PYTHONPATH")) if p)
    yield env
    for name in [m for m in sys.modules if m.startswith("example_")]:
        sys.modules.pop(name)
    registry.families.cache_clear()
