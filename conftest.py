"""Root conftest: makes the repository importable when the package is not installed."""
