"""Conformance checks: every registered mechanism and flow against the mechanism contract."""
