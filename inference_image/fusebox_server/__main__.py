"""`python -m fusebox_server --model-dir DIR ...` (see config.py for every flag)."""

import os
import sys

from fusebox_server.model.kernel_caches import bound_kernel_caches

# Before torch is imported: it reads the bounds once, at load.
if (refusal := bound_kernel_caches(os.environ)) is not None:
    print(f"fusebox_server: invalid environment: {refusal}", file=sys.stderr)
    sys.exit(2)

from fusebox_server.control.early_checks import refusal_before_torch  # noqa: E402

# Wrong flags or a model directory missing from the volume exit now, not after torch's
# import: the crash loop is told in the time a pod takes to start (early_checks.py).
if (refusal := refusal_before_torch(sys.argv[1:], os.environ)) is not None:
    print(f"fusebox_server: {refusal}", file=sys.stderr)
    sys.exit(2)

from fusebox_server.http.server import main  # noqa: E402  (torch loads here)

sys.exit(main())
