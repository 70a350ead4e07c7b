"""What a package exports is defined in a public module of sss, so its documented home is a module users may import."""

from __future__ import annotations

import importlib
import pkgutil

import sss

# Still defined in a private module; each is to move to a public module of its package.
KNOWN = {"sss.data.SkipLog"}


def _private(module: str) -> bool:
    return any(part.startswith("_") for part in module.split("."))


def _exported_from_private_modules() -> set[str]:
    packages = ["sss"] + [m.name for m in pkgutil.walk_packages(sss.__path__, "sss.") if m.ispkg]
    found = set()
    for name in packages:
        if _private(name):
            continue
        package = importlib.import_module(name)
        for attr in getattr(package, "__all__", []):
            home = getattr(getattr(package, attr), "__module__", None) or ""
            if home.split(".")[0] == "sss" and _private(home):
                found.add(f"{name}.{attr}")
    return found


def test_no_package_exports_a_name_defined_in_a_private_module():
    assert _exported_from_private_modules() - KNOWN == set()


def test_data_error_lives_in_sss_data_errors():
    from sss.data import DataError
    from sss.data.errors import DataError as defined

    assert DataError is defined and DataError.__module__ == "sss.data.errors"
