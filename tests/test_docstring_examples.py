"""Every docstring example in the package runs and prints what it shows (a stale example is a wrong document).

``tests/plan/test_plan_doctests.py`` checks the planning modules one by one; this walks every module of
``graphkv``, so an example added anywhere is checked too. Usage sketches that cannot run on their own are
written as literal blocks (``::``), not as ``>>>`` examples.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import graphkv

FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def test_every_docstring_example_of_the_package_passes() -> None:
    """Each module imports, and every ``>>>`` example in it gives its shown output (over 100 examples)."""
    attempted, failed = 0, []
    for info in pkgutil.walk_packages(graphkv.__path__, "graphkv."):
        module = importlib.import_module(info.name)
        result = doctest.testmod(module, optionflags=FLAGS, report=False)
        attempted += result.attempted
        if result.failed:
            failed.append(f"{info.name}: {result.failed} of {result.attempted}")
    assert failed == [], "docstring examples that fail (run `python -m doctest -v FILE` on each): " + "; ".join(failed)
    assert attempted >= 100
