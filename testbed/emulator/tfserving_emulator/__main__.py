"""``python -m tfserving_emulator`` == ``tensorflow_model_server``."""

import os
import sys

from . import tfruntime

tfruntime.lean()  # before anything imports tensorflow: the runtime, not the Python API

from .server import main  # noqa: E402

if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # daemon threads (pollers, batch threads, gRPC) must not keep a failed start alive
    os._exit(code)
