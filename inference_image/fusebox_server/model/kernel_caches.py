"""Bounds for the CPU kernels' per-shape caches; applied before torch is imported.

Why: oneDNN (through PyTorch's ideep layer) builds a kernel for every row
count a packed linear layer sees (`cpu_kernels.PackedLinear`) and keeps it in
two caches, ideep's LRU and oneDNN's primitive cache, 1,024 entries each by
default, a kernel being larger the more rows it takes. Every prompt length is
a new row count: one call per product at the defaults grew a process's RSS
by 248 MiB over 190 prompt lengths (512x1408 weight), headed for about a GiB,
the unbounded-cache creep Fusebox exists to catch. With prompts split into
calls of at most 64 rows (`MAX_ROWS_PER_CALL`) and both caches at 32
entries, the same lengths grew it 26 MiB, and no further. A decode step
reuses the kernels of its batch size; a miss costs about 0.7 ms of kernel
building beside a 30 ms step.

Both are read once, when torch loads, so `python -m fusebox_server` calls
`bound_kernel_caches` before anything imports torch. A value already in the
environment (`server.env`) is kept: it is the user's to tune; one that is
not a whole number exits 2 naming it (`--check-config` too).
"""

from __future__ import annotations

import re
from collections.abc import MutableMapping
from typing import Final

KERNEL_CACHE_ENTRIES: Final = 32
KERNEL_CACHE_ENVS: Final = ("LRU_CACHE_CAPACITY", "ONEDNN_PRIMITIVE_CACHE_CAPACITY")


def bound_kernel_caches(environ: MutableMapping[str, str]) -> str | None:
    """Set both bounds unless set; why a value already set is refused, or None.

    oneDNN reads the value as a number and crashes the process (SIGSEGV, at
    the first packed product) on anything else, so a non-number must stop the
    server with its name before torch loads.
    """
    for name in KERNEL_CACHE_ENVS:
        value = environ.setdefault(name, str(KERNEL_CACHE_ENTRIES))
        if not re.fullmatch(r"[0-9]+", value):
            return f"{name}={value!r} must be a whole number of cache entries (0 or more)"
    return None
