"""`python -m fusebox_server --model-dir DIR ...` (see config.py for every flag)."""

import os
import sys

from fusebox_server.model.kernel_caches import bound_kernel_caches

# Before torch is imported: it reads the bounds once, at load.
if (refusal := bound_kernel_caches(os.environ)) is not None:
    print(f"fusebox_server: invalid environment: {refusal}", file=sys.stderr)
    sys.exit(2)

from fusebox_server.http.server import main  # noqa: E402  (torch loads here)

sys.exit(main())
