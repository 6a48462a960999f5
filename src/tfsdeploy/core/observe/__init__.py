"""TFServing's metrics read and judged (the guard), and what fab observe writes: Prometheus' scrape
configuration, rules and alerts, Grafana dashboards (pure)."""
