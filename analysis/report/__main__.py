"""``python -m analysis.report --experiment NAME``: the sweep report (``analysis.report.main``)."""

from analysis.report import main

raise SystemExit(main())
