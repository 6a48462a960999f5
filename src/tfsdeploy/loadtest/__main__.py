"""``python -m tfsdeploy.loadtest``: the load generator's command line."""

import sys

from tfsdeploy.loadtest.cli import main

if __name__ == "__main__":
    sys.exit(main())
