"""`python -m fusebox_server --model-dir DIR ...` (see config.py for every flag)."""

import sys

from fusebox_server.server import main

sys.exit(main())
