"""Fixtures of the deploy tests: the integration tests' embedded broker and its settings."""

from tests.integration.conftest import broker, kafka

__all__ = ["broker", "kafka"]
