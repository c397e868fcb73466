"""Running flows in production: recovery stores, incarnations, clusters, heartbeats, locks."""
