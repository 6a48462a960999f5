"""Fixtures of the emulator tests; the helpers live in emulator_support (a unique module name,
so that other test folders' conftest modules never shadow them)."""

from emulator_support import emulator, sources

__all__ = ["emulator", "sources"]
