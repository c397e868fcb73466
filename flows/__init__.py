"""Ready dataflows: ``build(...)`` factories runnable with ``python -m bytewax.run``."""
