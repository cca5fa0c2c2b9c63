"""`python -m fusebox_operator.chart_hooks`: what the chart's hook Jobs run."""

from fusebox_operator.chart_hooks.cli import main

raise SystemExit(main())
