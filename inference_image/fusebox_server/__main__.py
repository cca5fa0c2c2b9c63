"""`python -m fusebox_server --model-dir DIR ...` (see config.py for every flag)."""

import os
import sys

from fusebox_server.kernel_caches import bound_kernel_caches

bound_kernel_caches(os.environ)  # before torch is imported: it reads them once, at load

from fusebox_server.server import main  # noqa: E402  (torch loads here)

sys.exit(main())
