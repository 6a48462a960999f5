"""fab tune's search and fab diagnose's reading of a live instance: where a request's time goes and
which stage limits it (pure)."""
