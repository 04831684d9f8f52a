"""``python -m analysis.report --experiment NAME``: the sweep report (``analysis.report.main``)."""

import sys

from analysis.report import main

if __name__ == "__main__":
    sys.exit(main())
