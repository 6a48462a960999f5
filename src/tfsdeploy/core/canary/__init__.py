"""A canary on live traffic: its weighted steps and verdicts, and the prediction comparison of the
new slot against the old (pure)."""
