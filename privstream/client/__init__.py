"""The device library: local randomisers, the device's own w-event ledger and its durable store,
CGM's noise chain and SaO2's randomiser behind a shuffler (``sao2``).

Its core runs where the server does not (phones, browsers, embedded agents): the Python
standard library only, no NumPy, no Bytewax, no Kafka client (tests/test_layout.py enforces
it). See docs/client.md for the trust model.
"""

from privstream.client.cgm import CgmAnswer, CgmDevice, chain_step
from privstream.client.device import Device, Report, Request
from privstream.client.ledger import GaussianLedger, GaussianPolicy, Ledger, Policy, Refusal
from privstream.client.randomizers import ORACLES, Randomness, SystemRandomness, randomize
from privstream.client.sao2 import Sao2Device
from privstream.client.store import FileStore, StoreError

__all__ = [
    "ORACLES",
    "CgmAnswer",
    "CgmDevice",
    "Device",
    "FileStore",
    "GaussianLedger",
    "GaussianPolicy",
    "Ledger",
    "Policy",
    "Randomness",
    "Refusal",
    "Report",
    "Request",
    "Sao2Device",
    "StoreError",
    "SystemRandomness",
    "chain_step",
    "randomize",
]
