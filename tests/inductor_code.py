"""Reading Inductor's generated code in tests: what buffers a compiled graph allocates."""

from __future__ import annotations

import math
import re

_ALLOCATION = re.compile(r"empty_strided_\w+\(\(([^)]*)\)")


def allocations(code: str, symbol_size: int) -> list[int]:
    """Element counts of every buffer a generated graph allocates (symbolic sizes taken as ``symbol_size``)."""
    sizes = []
    for match in _ALLOCATION.finditer(code):
        dims = [d.strip() for d in match.group(1).split(",") if d.strip()]
        sizes.append(math.prod(int(d) if d.isdigit() else symbol_size for d in dims))
    return sizes
