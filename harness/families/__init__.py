"""One definition per kernel family (`FamilyDef`), and the lookup `get`.

Each module here defines one family: ``linear_scan``, ``selective_scan``, ``retention``,
``retention_normed``, ``simple_gla``, ``gla``, ``ssd``. The rest of the harness asks ``get(family)`` for argument order, shapes, regimes,
inputs, oracle, baseline and bounds (see `harness.families.base`). A new family is one module with a
``FAMILY`` object, named in `MODULES`.
"""

from __future__ import annotations

import importlib

from harness.errors import InvalidArgument
from harness.families.base import FamilyDef
from harness.kernels.contract import Family

#: The module of each family's definition, by family name.
MODULES: dict[str, str] = {
    "linear_scan": "harness.families.linear_scan",
    "selective_scan": "harness.families.selective_scan",
    "retention": "harness.families.retention",
    "retention_normed": "harness.families.retention_normed",
    "simple_gla": "harness.families.simple_gla",
    "gla": "harness.families.gla",
    "ssd": "harness.families.ssd",
}

_CACHE: dict[Family, FamilyDef] = {}


def get(family: Family | str) -> FamilyDef:
    """The definition of ``family`` (a `Family` or its name)."""
    fam = Family.parse(family)
    found = _CACHE.get(fam)
    if found is None:
        module = MODULES.get(fam.value)
        if module is None:
            raise InvalidArgument(f"family={fam.value!r} has no definition; add a module to harness.families")
        found = _CACHE[fam] = importlib.import_module(module).FAMILY
    return found


__all__ = ["FamilyDef", "MODULES", "get"]
