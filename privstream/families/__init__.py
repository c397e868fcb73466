"""Mechanism families: their entries (what the generic template needs) and their discovery."""
