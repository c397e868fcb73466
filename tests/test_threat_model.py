"""docs/threat-model.md maps every adversary capability to a defence and a test: each test it
names must exist, so the page cannot drift from the suite (design §12)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "threat-model.md"
REFERENCE = re.compile(r"`((?:[\w/]+/)?test_\w+\.py)((?:::\w+)?)`")
CONTINUED = re.compile(r"`::(\w+)`")


def references() -> list[tuple[str, str]]:
    """(test file, function or "") for every test the page names; ``::name`` alone continues
    the file named before it in the same cell."""
    found: list[tuple[str, str]] = []
    for line in PAGE.read_text().splitlines():
        if not line.startswith("|"):
            continue
        for cell in line.split("|"):
            current = None
            for match in re.finditer(r"`[^`]+`", cell):
                token = match.group(0)
                full, cont = REFERENCE.fullmatch(token), CONTINUED.fullmatch(token)
                if full:
                    current = full.group(1)
                    found.append((current, full.group(2).removeprefix("::")))
                elif cont and current is not None:
                    found.append((current, cont.group(1)))
    return found


def test_the_page_names_tests_for_each_kind_of_adversary() -> None:
    text = PAGE.read_text()
    for heading in ("### A sender", "### A reader", "### An operator", "### Fooling the audit"):
        assert heading in text
    assert len(references()) >= 60


def test_every_test_the_threat_model_names_exists() -> None:
    missing = []
    for path, name in references():
        file = ROOT / "tests" / path
        if not file.is_file():
            missing.append(path)
        elif name and not re.search(rf"^def {name}\(", file.read_text(), re.M):
            missing.append(f"{path}::{name}")
    assert not missing, missing
