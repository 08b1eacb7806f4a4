"""The installed version of dpppl, which every result and report records."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("dpppl")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0.0.0"
