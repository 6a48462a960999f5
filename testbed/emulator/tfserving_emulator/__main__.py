"""``python -m tfserving_emulator`` == ``tensorflow_model_server``."""

import os
import sys

from .server import main

if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # daemon threads (pollers, batch threads, gRPC) must not keep a failed start alive
    os._exit(code)
