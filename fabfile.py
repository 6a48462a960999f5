"""Fabric looks for `fabfile`; the tasks live in tasks.py (Invoke's and this project's name)."""

from tasks import ns

__all__ = ["ns"]
