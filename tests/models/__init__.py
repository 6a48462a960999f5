"""Tests of the testbed's model generator (testbed/models, scripts/make-models)."""
