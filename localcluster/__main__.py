"""Entry point: `python -m localcluster ...`."""

from localcluster.cli import main

raise SystemExit(main())
