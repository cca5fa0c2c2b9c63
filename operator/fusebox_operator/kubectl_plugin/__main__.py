"""`python -m fusebox_operator.kubectl_plugin`: the same as `kubectl fusebox`."""

from fusebox_operator.kubectl_plugin.cli import main

raise SystemExit(main())
