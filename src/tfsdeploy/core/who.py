"""Who runs the toolkit, as its records and audit lines say it (self-reported)."""

from __future__ import annotations

import getpass
import os
import socket


def user_name() -> str:
    """This process's user, also where the password database has no entry for it."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid{os.getuid()}"


def current_user() -> str:
    """``user@machine`` of this process (what records and audit lines say: self-reported)."""
    return f"{user_name()}@{socket.gethostname()}"
