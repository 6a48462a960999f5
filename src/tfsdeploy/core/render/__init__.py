"""Every file a host receives for a release (TFServing's files, the per-host and gateway HAProxy
configurations), rendered and checked before any connection (pure)."""
