"""Sources, sinks and services around the dataflows: synthetic and file sources, JSON lines,
(later) Kafka, Prometheus and the embedded broker. Imports no mechanism internals (design §2)."""
