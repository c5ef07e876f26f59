"""The names the command line checks before torch is imported: the kernel families (`Family`) and the
dtypes a kernel is run in (`ALL_DTYPES`). Kept apart from the contract (which maps them to torch) so that a
usage error is answered at once, not after torch's import."""

from __future__ import annotations

import enum

from harness.errors import InvalidArgument


class Family(str, enum.Enum):
    """The kernel families; the value is the name used on the command line and in records."""

    LINEAR_SCAN = "linear_scan"
    SELECTIVE_SCAN = "selective_scan"
    RETENTION = "retention"
    RETENTION_NORMED = "retention_normed"
    SIMPLE_GLA = "simple_gla"
    GLA = "gla"
    SSD = "ssd"

    @classmethod
    def parse(cls, value: "str | Family") -> "Family":
        if isinstance(value, Family):
            return value
        try:
            return cls(value)
        except ValueError:
            names = ", ".join(f.value for f in cls)
            raise InvalidArgument(f"family={value!r} is not a kernel family; expected one of: {names}") from None

    @property
    def output_name(self) -> str:
        return {"linear_scan": "h", "selective_scan": "y", "ssd": "y"}.get(self.value, "o")


#: The dtypes a kernel is run in, by name (`harness.kernels.contract.DTYPE_NAMES` maps them to torch's).
ALL_DTYPES: tuple[str, ...] = ("float64", "float32", "float16", "bfloat16")
