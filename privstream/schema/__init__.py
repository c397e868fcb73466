"""The neutral schemas at the bottom of the import graph: events, dead letters, metric names."""
