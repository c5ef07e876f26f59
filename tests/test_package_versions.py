"""What `harness list` says when a kernel package is there but is not the one the adapter was written for.

Found by putting an old ``flash-linear-attention`` (0.2.2, which installs the same ``fla`` as fla-core)
ahead of the installed fla-core 0.6.0 on PYTHONPATH, as a user with both would have it: every fla kernel
was unavailable "with fla-core 0.6.0" (the version that was *not* imported), and one "package 'fla-core' is
not installed (No module named 'transformers')" (it was; its old copy lacked a dependency). Now the copy
that was imported is named with its distribution and version, and a missing dependency or submodule is
told from a missing package.
"""

from __future__ import annotations

import torch

import importlib
import sys
from pathlib import Path

import pytest

from harness.kernels.contract import KernelUnavailable, package_version, require_module


def _dist(root: Path, name: str, version: str, module: str, init: str = "") -> Path:
    (root / module).mkdir(parents=True)
    (root / module / "__init__.py").write_text(init)
    info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "top_level.txt").write_text(module + "\n")
    return root


@pytest.fixture
def two_copies(tmp_path, monkeypatch):
    """``harnessfake`` installed by ``harness-fake`` 1.0, and a copy of another distribution (2.0) first
    on sys.path whose import needs a module that does not exist."""
    installed = _dist(tmp_path / "site", "harness-fake", "1.0", "harnessfake")
    ahead = _dist(tmp_path / "ahead", "harness-fake-old", "2.0", "harnessfake", init="import harness_no_such_dep_xyz\n")
    monkeypatch.setattr(sys, "path", [str(ahead), str(installed), *sys.path])
    importlib.invalidate_caches()
    yield ahead, installed
    sys.modules.pop("harnessfake", None)
    importlib.invalidate_caches()


def test_the_copy_imported_ahead_of_the_installed_one_is_named(two_copies):
    ahead, _ = two_copies
    text = package_version("harness-fake")
    assert text == f"harness-fake 1.0 (but 'harnessfake' is imported from {ahead.resolve() / 'harnessfake'}: " \
                   "harness-fake-old 2.0)"


def test_a_missing_dependency_is_not_called_a_missing_package(two_copies):
    with pytest.raises(KernelUnavailable) as err:
        require_module("harnessfake", package="harness-fake")
    message = str(err.value)
    assert "is not installed;" not in message.split("needs")[0]
    assert "does not import: harnessfake needs 'harness_no_such_dep_xyz'" in message
    assert "`pip install harness_no_such_dep_xyz`" in message and "harness-fake-old 2.0" in message


def test_a_missing_submodule_names_the_version_that_lacks_it(tmp_path, monkeypatch):
    installed = _dist(tmp_path / "site", "harness-fake", "1.0", "harnessfake")
    monkeypatch.setattr(sys, "path", [str(installed), *sys.path])
    importlib.invalidate_caches()
    try:
        with pytest.raises(KernelUnavailable, match=r"harness-fake 1\.0 has no module 'harnessfake.ops'"):
            require_module("harnessfake.ops.kernel", package="harness-fake")
        assert package_version("harness-fake") == "harness-fake 1.0"  # the installed copy is the one imported
    finally:
        sys.modules.pop("harnessfake", None)


def test_a_package_that_is_not_there_is_still_called_not_installed():
    with pytest.raises(KernelUnavailable, match=r"'harness-absent' is not installed .*`pip install harness-absent`"):
        require_module("harness_absent_pkg_xyz.ops", package="harness-absent")


def test_a_package_that_imports_its_own_module_as_top_level_is_not_told_to_install_it(tmp_path, monkeypatch):
    """mambapy 0.1.0's ``mambapy/mamba.py`` says ``from pscan import pscan``: "`pip install pscan`" would
    install an unrelated package, if any; the reason says it is the version's packaging bug."""
    root = _dist(tmp_path / "site", "harness-fake", "0.1", "harnessfake")
    (root / "harnessfake" / "scan.py").write_text("X = 1\n")
    (root / "harnessfake" / "model.py").write_text("from scan import X\n")
    monkeypatch.setattr(sys, "path", [str(root), *sys.path])
    importlib.invalidate_caches()
    try:
        with pytest.raises(KernelUnavailable) as err:
            require_module("harnessfake.model", package="harness-fake")
    finally:
        for name in [n for n in sys.modules if n.startswith("harnessfake")]:
            sys.modules.pop(name)
    message = str(err.value)
    assert "harness-fake 0.1 does not import: harnessfake.model imports its own module 'scan' as a top-level" in message
    assert "pip install scan" not in message


def test_a_second_kernel_of_the_same_name_is_loaded_not_the_first():
    """Loaded kernels are cached by (name, id of the spec's loader). Keyed by the id alone, a new spec's
    loader could take the id of a freed one and get its kernel: the second of two kernels named ``scan``
    (closures, a notebook's redefinition, a parametrized test) silently ran the first."""
    from harness.api import user_kernel_spec

    def make(i):
        def scan(a, b):
            return a * 0 + i
        return scan

    kernels = [make(i) for i in range(40)]  # made first: each spec's loader is then the only new function
    one = torch.ones(1, 1, 1)
    got = []
    for kernel in kernels:
        spec = user_kernel_spec(kernel, family="linear_scan", name="scan")
        got.append(int(spec.callable()(one, one).item()))
        del spec  # its loader freed, unless the cache holds it
    assert got == list(range(40))
