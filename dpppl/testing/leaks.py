"""The search for private data in a result: :func:`find_leaks` looks for the records' values and
their aggregates everywhere outside the released posterior, and :func:`capture` collects the
warnings, log records and printed output of a fit for it to search.  :func:`find_in_bytes` looks
for them in any bytes, e.g. what is pickled for another process."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import re
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xarray as xr

#: A number in text (attributes, messages) is compared with the private values only when it is
#: written with at least this many significant digits: shorter ones match by coincidence.
_TEXT_DIGITS = 8


@dataclass
class Captured:
    """Warnings, log records and printed output of a block, as text."""

    warnings: list[str] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)
    stdout: str = ""
    stderr: str = ""

    def texts(self) -> dict[str, str]:
        return {
            **{f"warning {i + 1}": text for i, text in enumerate(self.warnings)},
            **{f"log record {i + 1}": text for i, text in enumerate(self.logs)},
            "stdout": self.stdout,
            "stderr": self.stderr,
        }


class _ListHandler(logging.Handler):
    def __init__(self, sink: list[str]):
        super().__init__(logging.INFO)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        self.sink.append(f"{record.name}: {record.getMessage()}")


@contextlib.contextmanager
def capture() -> Iterator[Captured]:
    """Collect the warnings, log records (INFO and above) and printed output of the block."""
    captured = Captured()
    out, err = io.StringIO(), io.StringIO()
    handler = _ListHandler(captured.logs)
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    # INFO and above: what a plugin says to its users.  DEBUG would make JAX and PyTensor log
    # every compilation, slowly, and they log no data.
    root.setLevel(min(level, logging.INFO) if level else logging.INFO)
    try:
        with (
            warnings.catch_warnings(record=True) as caught,
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
        ):
            warnings.simplefilter("always")
            yield captured
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
        captured.stdout, captured.stderr = out.getvalue(), err.getvalue()
    captured.warnings = [f"{w.category.__name__}: {w.message}" for w in caught]


def _significant_digits(token: str) -> int:
    mantissa = re.split(r"[eE]", token.lstrip("+-"))[0].replace(".", "")
    return len(mantissa.lstrip("0"))


_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


@dataclass
class Sentinels:
    """Private values to look for: the records' distinctive float values and their aggregates.

    The example models' float records are random float64 values, so each one is a sentinel: no
    public quantity equals it by chance.  Aggregates (sums, means, extremes, sums of squares and
    logs: the sufficient statistics of common families) catch a mechanism that releases an
    unnoised statistic.
    """

    values: np.ndarray
    labels: list[str]

    @classmethod
    def of(cls, data: Mapping[str, np.ndarray]) -> Sentinels:
        values: list[float] = []
        labels: list[str] = []
        for name, array in data.items():
            array = np.asarray(array)
            if array.dtype.kind != "f":
                continue
            flat = array.reshape(array.shape[0], -1)
            for index, value in enumerate(flat[:, 0] if flat.shape[1] == 1 else flat.ravel()):
                values.append(float(value))
                labels.append(f"a value of record array {name!r} (entry {index})")
            aggregates = {
                "sum": flat.sum(axis=0),
                "mean": flat.mean(axis=0),
                "minimum": flat.min(axis=0),
                "maximum": flat.max(axis=0),
                "sum of squares": (flat**2).sum(axis=0),
                "standard deviation": flat.std(axis=0),
            }
            if np.all(flat > 0):
                aggregates["sum of logs"] = np.log(flat).sum(axis=0)
            for what, column_values in aggregates.items():
                for column, value in enumerate(np.atleast_1d(column_values)):
                    values.append(float(value))
                    labels.append(f"the {what} of record array {name!r} (column {column})")
        keep = [
            i
            for i, v in enumerate(values)
            if math.isfinite(v) and _significant_digits(f"{v:.15g}") >= _TEXT_DIGITS
        ]
        return cls(np.array([values[i] for i in keep]), [labels[i] for i in keep])

    def __bool__(self) -> bool:
        return self.values.size > 0

    def match(self, value: float, rtol: float) -> str | None:
        """The label of a sentinel equal to ``value`` within ``rtol``, or None."""
        if not math.isfinite(value) or value == 0:
            return None
        close = np.isclose(self.values, value, rtol=rtol, atol=0.0)
        return self.labels[int(np.argmax(close))] if close.any() else None

    def in_text(self, text: str) -> list[str]:
        """Sentinels written in ``text`` with at least ``_TEXT_DIGITS`` significant digits."""
        found = []
        for token in _NUMBER.findall(text):
            if _significant_digits(token) < _TEXT_DIGITS:
                continue
            label = self.match(float(token), rtol=10.0 ** (1 - _TEXT_DIGITS))
            if label is not None:
                found.append(f"{token} ({label})")
        return found

    def in_array(self, array: np.ndarray) -> list[str]:
        array = np.asarray(array)
        if array.dtype.kind not in "fc" or array.size == 0:
            return []
        flat = np.real(array).astype(float).ravel()
        close = np.isclose(flat[:, None], self.values[None, :], rtol=1e-9, atol=0.0)
        close &= flat[:, None] != 0
        hits = np.argwhere(close)
        return [f"{float(flat[i])!r} ({self.labels[j]})" for i, j in hits[:3]]

    def in_bytes(self, blob: bytes) -> list[str]:
        found = []
        for value, label in zip(self.values, self.labels, strict=True):
            for order in ("<f8", ">f8"):
                if np.array(value, dtype=order).tobytes() in blob:
                    found.append(f"{value!r} as float64 ({label})")
                    break
        return found


def _walk_attr(value: Any, sentinels: Sentinels) -> list[str]:
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return sentinels.in_text(value)
        # JSON numbers are compared at full precision; strings inside are searched as text.
        return _walk_attr(parsed, sentinels) if not isinstance(parsed, str) else (
            sentinels.in_text(parsed)
        )
    if isinstance(value, Mapping):
        return [hit for item in value.values() for hit in _walk_attr(item, sentinels)]
    if isinstance(value, (list, tuple)):
        return [hit for item in value for hit in _walk_attr(item, sentinels)]
    if isinstance(value, np.ndarray):
        return sentinels.in_array(value)
    if isinstance(value, (float, np.floating)):
        label = sentinels.match(float(value), rtol=1e-9)
        return [] if label is None else [f"{float(value)!r} ({label})"]
    return []


def find_leaks(
    result: xr.DataTree,
    data: Mapping[str, np.ndarray],
    *,
    texts: Mapping[str, str] | None = None,
    netcdf: bytes | None = None,
) -> list[str]:
    """Where private values of ``data`` appear in a result, outside its released posterior.

    Looks for every distinctive float value of the records and their aggregates (see
    :class:`Sentinels`) in: the attributes of every group and variable (numbers, JSON and
    numbers written in text with at least 8 significant digits); the values and coordinates of
    every group but ``posterior`` (to 1e-9 relative); the netCDF bytes (exact float64, either
    byte order); and ``texts`` (warnings, log records, printed output).

    Returns
    -------
    list of str
        One line per place a private value was found; empty when none was.
    """
    sentinels = Sentinels.of(data)
    if not sentinels:
        return []
    found: list[str] = []
    for node in result.subtree:
        where = node.path
        for key, value in node.attrs.items():
            found += [f"attribute {key!r} of {where}: {hit}" for hit in _walk_attr(value, sentinels)]
        dataset = node.to_dataset(inherit=False)
        for name, variable in dataset.variables.items():
            for key, value in variable.attrs.items():
                found += [
                    f"attribute {key!r} of {where}/{name}: {hit}"
                    for hit in _walk_attr(value, sentinels)
                ]
            if node.path != "/posterior":
                found += [
                    f"values of {where}/{name}: {hit}" for hit in sentinels.in_array(variable.values)
                ]
    for where, text in (texts or {}).items():
        found += [f"{where}: {hit}" for hit in sentinels.in_text(text)]
    if netcdf is not None:
        found += [f"the netCDF file: {hit}" for hit in sentinels.in_bytes(netcdf)]
    return found


def find_in_bytes(blob: bytes, data: Mapping[str, np.ndarray]) -> list[str]:
    """Where private values of ``data`` appear in ``blob`` (a pickle sent to a worker, a file).

    Looks for every distinctive float value of the records and their aggregates (see
    :class:`Sentinels`) as float64, in either byte order.  Integer records are not searched:
    small integers occur everywhere.

    Returns
    -------
    list of str
        One line per private value found; empty when none was.
    """
    return Sentinels.of(data).in_bytes(blob)
