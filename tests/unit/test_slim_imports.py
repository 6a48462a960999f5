"""The plain install (`pip install tfsdeploy`, no extras) has no tensorflow,
tensorflow_serving, numpy or matplotlib: every module of the package must import without them
(matplotlib is installed by the first plot: loadtest/plotting.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

ABSENT = ("tensorflow", "tensorflow_serving", "numpy", "matplotlib")


def test_every_module_imports_without_tensorflow_numpy_or_matplotlib() -> None:
    code = textwrap.dedent(f"""
        import importlib, pkgutil, sys
        for name in {ABSENT!r}:
            sys.modules[name] = None  # any import of them raises ImportError
        import tfsdeploy
        failed, count = [], 0
        for module in pkgutil.walk_packages(tfsdeploy.__path__, "tfsdeploy."):
            if module.name.endswith("__main__"):
                continue  # runs its command when imported
            count += 1
            try:
                importlib.import_module(module.name)
            except ImportError as err:
                failed.append(f"{{module.name}}: {{err}}")
        print(count, failed)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    count, failed = out.stdout.strip().split(" ", 1)
    assert int(count) > 100 and failed == "[]"
