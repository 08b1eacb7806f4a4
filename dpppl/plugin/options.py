"""A mechanism's options, checked from the annotations of its ``Options`` dataclass.

A plugin declares each option once, with its type and, for numbers, its range::

    @dataclass(frozen=True)
    class Options:
        steps: Annotated[int, POSITIVE] = 10_000
        sampling_rate: Annotated[float, Interval(0, 1, low_open=True)] = 0.1
        clipping_bound: Annotated[float, POSITIVE] | None = None
        inference: Literal["nuts", "laplace"] = "nuts"

and :class:`dpppl.Mechanism` refuses a value outside it with :class:`InvalidOptionError` before
the options object is built: ``Literal`` choices, integers (never booleans), finite numbers,
``None`` where the annotation allows it, and the :class:`Interval` of ``typing.Annotated``.
Rules that tie options together stay in ``Options.__post_init__``, raising the same error.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union

from dpppl.errors import InvalidOptionError

__all__ = ["NON_NEGATIVE", "POSITIVE", "Interval", "check_options"]


@dataclass(frozen=True)
class Interval:
    """The range of a numeric option, given as ``Annotated[float, Interval(...)]``.

    ``None`` leaves a side unbounded; ``low_open`` / ``high_open`` exclude the bound itself.
    """

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value: float) -> bool:
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        below = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return above and below

    def describe(self, integer: bool) -> str:
        """The range in words, as an error message puts it."""
        if self.high is None and self.low == 0:
            if integer:
                return "a positive integer" if self.low_open else "a non-negative integer"
            return "a positive finite number" if self.low_open else "a non-negative finite number"
        kind = "an integer" if integer else "a finite number"
        if self.high is None:
            return f"{kind} {'>' if self.low_open else '>='} {self.low:g}"
        if self.low is None:
            return f"{kind} {'<' if self.high_open else '<='} {self.high:g}"
        left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
        return f"in {left}{self.low:g}, {self.high:g}{right}"


#: Greater than zero.
POSITIVE = Interval(0, None, low_open=True)
#: Zero or more.
NON_NEGATIVE = Interval(0, None)


def check_options(mechanism: str, options_class: type, values: Mapping[str, Any]) -> None:
    """Refuse any of ``values`` (option name -> value; defaults for the missing ones) that its
    annotation in ``options_class`` does not allow."""
    hints = typing.get_type_hints(options_class, include_extras=True)
    for field in dataclasses.fields(options_class):
        if field.name not in values:
            continue
        problem = _problem(hints.get(field.name, Any), values[field.name])
        if problem is not None:
            raise InvalidOptionError(
                f"{mechanism} option {field.name} must be {problem}, got {values[field.name]!r}"
            )


def _problem(hint: Any, value: Any) -> str | None:
    """What ``value`` should have been under ``hint``, or None if it fits."""
    origin = typing.get_origin(hint)
    if origin is Annotated:
        base, *extras = typing.get_args(hint)
        problem = _problem(base, value)
        intervals = [extra for extra in extras if isinstance(extra, Interval)]
        if problem is None and all(value in interval for interval in intervals):
            return None
        return intervals[0].describe(integer=base is int) if intervals else problem
    if origin in (Union, types.UnionType):
        members = typing.get_args(hint)
        if value is None and type(None) in members:
            return None
        problems = [_problem(m, value) for m in members if m is not type(None)]
        if any(p is None for p in problems):
            return None
        return " or ".join(problems) + (" or None" if type(None) in members else "")
    if origin is Literal:
        choices = typing.get_args(hint)
        if value in choices and type(value) in {type(c) for c in choices}:
            return None
        return "one of " + ", ".join(repr(c) for c in choices)
    if hint is bool:
        return None if isinstance(value, bool) else "True or False"
    if hint is int:
        integer = isinstance(value, numbers.Integral) and not isinstance(value, bool)
        return None if integer else "an integer"
    if hint is float:
        number = isinstance(value, numbers.Real) and not isinstance(value, bool)
        return None if number and math.isfinite(value) else "a finite number"
    if hint is str:
        return None if isinstance(value, str) else "a string"
    return None
