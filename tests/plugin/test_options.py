"""A mechanism's options are checked from the annotations of its Options dataclass."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, ClassVar, Literal

import numpy as np
import pytest

import dpppl
from dpppl import NON_NEGATIVE, POSITIVE, Interval, InvalidOptionError, Mechanism


class Example(Mechanism):
    name: ClassVar[str] = "example"

    @dataclass(frozen=True)
    class Options:
        steps: Annotated[int, POSITIVE] = 10
        rate: Annotated[float, Interval(0, 1, low_open=True)] = 0.5
        floor: Annotated[float, NON_NEGATIVE] = 0.0
        bound: Annotated[float, POSITIVE] | None = None
        order: Annotated[int, Interval(2, 8)] = 4
        method: Literal["nuts", "laplace"] = "nuts"
        verbose: bool = False
        label: str = "x"

        def __post_init__(self) -> None:
            if self.order > self.steps:
                raise InvalidOptionError("order must not exceed steps")

    def fit(self, model, data, plan, *, seed, progress):
        raise NotImplementedError


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"steps": 0}, "example option steps must be a positive integer, got 0"),
        ({"steps": 2.0}, "steps must be a positive integer"),
        ({"steps": True}, "steps must be a positive integer"),
        ({"rate": 0.0}, r"rate must be in \(0, 1\], got 0.0"),
        ({"rate": math.nan}, r"rate must be in \(0, 1\]"),
        ({"rate": "0.5"}, r"rate must be in \(0, 1\]"),
        ({"floor": -1e-9}, "floor must be a non-negative finite number"),
        ({"floor": math.inf}, "floor must be a non-negative finite number"),
        ({"bound": -1.0}, "bound must be a positive finite number or None"),
        ({"order": 9}, r"order must be in \[2, 8\]"),
        ({"method": "vi"}, "method must be one of 'nuts', 'laplace', got 'vi'"),
        ({"verbose": 1}, "verbose must be True or False"),
        ({"label": 3}, "label must be a string"),
        ({"steps": 3, "order": 4}, "order must not exceed steps"),
    ],
)
def test_a_value_its_annotation_does_not_allow_is_refused_with_the_rule(options, message):
    with pytest.raises(InvalidOptionError, match=message):
        Example(**options)


def test_values_within_their_annotations_are_kept_as_given():
    options = Example(steps=np.int64(20), rate=1, bound=None, order=8, method="laplace").options
    assert (options.steps, options.rate, options.bound, options.order) == (20, 1, None, 8)


def test_an_invalid_option_is_a_dpppl_error_and_a_value_error():
    assert issubclass(InvalidOptionError, dpppl.DPPPLError)
    assert issubclass(InvalidOptionError, ValueError)


def test_intervals_describe_themselves_as_error_messages_do():
    assert POSITIVE.describe(integer=True) == "a positive integer"
    assert Interval(2).describe(integer=True) == "an integer >= 2"
    assert Interval(None, 1, high_open=True).describe(integer=False) == "a finite number < 1"
    assert Interval(0, 1, high_open=True).describe(integer=False) == "in [0, 1)"
