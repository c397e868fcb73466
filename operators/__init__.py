"""Bytewax operators wrapping the engine-free mechanisms, one module per family.

``slotting`` holds what every family shares: turning keyed event batches into deterministic,
complete slots, routing bad input to dead letters, and stepping a mechanism per slot.
"""

from privstream.operators.slotting import MechanismOut, SlottingConfig, slotted_mechanism

__all__ = ["MechanismOut", "SlottingConfig", "slotted_mechanism"]
