"""``privstream`` with one more LDP-IDS mechanism, ``LBU_halts``: an LBU whose step fails at
slot ``PRIVSTREAM_TEST_HALT_AT`` (default 5) — the fault injection that drives a real flow into
a halted stream for the alerting end-to-end test. Run as ``python -m
tests.integration.faulty_flow run ldp-ids --mechanism LBU,LBU_halts ...`` from the repository
root (``PYTHONPATH``), with the arguments of ``privstream``."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from privstream.families import registry
from privstream.mechanisms.ldp_ids import LBU

HALT_AT = int(os.environ.get("PRIVSTREAM_TEST_HALT_AT", "5"))


class LBUHalts(LBU):
    """An LBU whose step raises at slot ``HALT_AT``: the stream halts before that release."""

    name = "LBU_halts"

    def decide(self, state: Any, slot: Any) -> Any:
        if slot.index == HALT_AT:
            raise ArithmeticError("injected fault")
        return super().decide(state, slot)


def main() -> int:
    family = registry.FAMILIES["ldp-ids"]
    mechanisms = {**family.mechanisms, LBUHalts.name: LBUHalts}
    registry.families()["ldp-ids"] = dataclasses.replace(family, mechanisms=mechanisms)
    from privstream.cli.commands import main as cli

    return cli()


if __name__ == "__main__":
    raise SystemExit(main())
