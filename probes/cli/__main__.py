"""`python -m probes.cli ...`: the `skewprobe` command."""

import sys

from probes.cli import main

if __name__ == "__main__":
    sys.exit(main())
