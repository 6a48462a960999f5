"""A roll's batches, its gates (pollers with a deadline), what a failed gate means, and the records
it leaves on a host (pure)."""
