"""Privacy events: what a mechanism released, in a form an accountant can account.

The vocabulary follows the DP-SGD literature and Google's ``dp_accounting`` so that accountant
plugins translate it one to one, but it lives in the core so that neither mechanisms nor the core
depend on any accounting library.  Every Gaussian event is expressed by its *noise multiplier*: the
standard deviation of the noise divided by the L2 sensitivity of what was released.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar


class NeighbourRelation(StrEnum):
    """Which data sets count as neighbours.

    ``ADD_OR_REMOVE_ONE``: one data set has one record more than the other (unbounded DP; the
    relation under which Poisson subsampling is amplified).  ``REPLACE_ONE``: the data sets have the
    same size and differ in one record (bounded DP; the relation for sampling a fixed number of
    records without replacement).
    """

    ADD_OR_REMOVE_ONE = "add_or_remove_one"
    REPLACE_ONE = "replace_one"


_KINDS: dict[str, type[PrivacyEvent]] = {}


class PrivacyEvent:
    """Base class of privacy events.  Events are immutable and compare by value."""

    kind: ClassVar[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _KINDS[cls.kind] = cls

    def to_dict(self) -> dict[str, Any]:
        """A JSON-compatible description; :func:`event_from_dict` reads it back."""
        raise NotImplementedError

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


def event_from_dict(data: dict[str, Any]) -> PrivacyEvent:
    """Rebuild an event written by :meth:`PrivacyEvent.to_dict`."""
    kind = data.get("kind")
    if kind not in _KINDS:
        raise ValueError(f"unknown privacy event kind {kind!r}; known kinds: {sorted(_KINDS)}")
    return _KINDS[kind]._from_dict(data)


def event_from_json(text: str) -> PrivacyEvent:
    return event_from_dict(json.loads(text))


def _positive_finite(name: str, value: float) -> float:
    value = float(value)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be positive and finite, got {value!r}")
    return value


def _count(name: str, value: int) -> int:
    if isinstance(value, bool) or int(value) != value or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class GaussianEvent(PrivacyEvent):
    """One release of a sum with L2 sensitivity 1 plus N(0, noise_multiplier²) noise per coordinate."""

    noise_multiplier: float
    kind: ClassVar[str] = "gaussian"

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "noise_multiplier", _positive_finite("noise_multiplier", self.noise_multiplier)
        )

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "noise_multiplier": self.noise_multiplier}

    @classmethod
    def _from_dict(cls, data: dict[str, Any]) -> GaussianEvent:
        return cls(data["noise_multiplier"])


@dataclass(frozen=True)
class PoissonSampledEvent(PrivacyEvent):
    """``event`` run on a subset in which every record is included independently with probability q.

    ``centred`` declares that every record's contribution to the released sum lies in a ball
    around zero whose radius is half the replace-one sensitivity (as per-record clipped gradients
    do: radius C, replace-one sensitivity 2C).  Under replace-one only that makes the noise
    multiplier determine the subsampled guarantee: the dominating pair is then
    q·N(−C, s²) + (1 − q)·N(0, s²) against q·N(+C, s²) + (1 − q)·N(0, s²).  A record that moves the
    sum from 0 to 2C has the same sensitivity but a worse pair, so without the declaration
    accountants refuse Poisson subsampling under replace-one.
    """

    sampling_probability: float
    event: PrivacyEvent
    centred: bool = False

    kind: ClassVar[str] = "poisson_sampled"

    def __post_init__(self) -> None:
        q = float(self.sampling_probability)
        if not 0 < q <= 1:
            raise ValueError(f"sampling_probability must be in (0, 1], got {q!r}")
        object.__setattr__(self, "sampling_probability", q)
        object.__setattr__(self, "centred", bool(self.centred))

    def to_dict(self) -> dict[str, Any]:
        data = {
            "kind": self.kind,
            "sampling_probability": self.sampling_probability,
            "event": self.event.to_dict(),
        }
        if self.centred:
            data["centred"] = True
        return data

    @classmethod
    def _from_dict(cls, data: dict[str, Any]) -> PoissonSampledEvent:
        return cls(
            data["sampling_probability"],
            event_from_dict(data["event"]),
            centred=bool(data.get("centred", False)),
        )


@dataclass(frozen=True)
class SampledWithoutReplacementEvent(PrivacyEvent):
    """``event`` run on ``sample_size`` records drawn uniformly without replacement from ``source_size``."""

    source_size: int
    sample_size: int
    event: PrivacyEvent
    kind: ClassVar[str] = "sampled_without_replacement"

    def __post_init__(self) -> None:
        n = _count("source_size", self.source_size)
        m = _count("sample_size", self.sample_size)
        if m > n:
            raise ValueError(f"sample_size ({m}) cannot exceed source_size ({n})")
        object.__setattr__(self, "source_size", n)
        object.__setattr__(self, "sample_size", m)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "source_size": self.source_size,
            "sample_size": self.sample_size,
            "event": self.event.to_dict(),
        }

    @classmethod
    def _from_dict(cls, data: dict[str, Any]) -> SampledWithoutReplacementEvent:
        return cls(data["source_size"], data["sample_size"], event_from_dict(data["event"]))


@dataclass(frozen=True)
class SelfComposedEvent(PrivacyEvent):
    """``event`` repeated ``count`` times, each time with fresh randomness."""

    event: PrivacyEvent
    count: int
    kind: ClassVar[str] = "self_composed"

    def __post_init__(self) -> None:
        object.__setattr__(self, "count", _count("count", self.count))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "count": self.count, "event": self.event.to_dict()}

    @classmethod
    def _from_dict(cls, data: dict[str, Any]) -> SelfComposedEvent:
        return cls(event_from_dict(data["event"]), data["count"])


@dataclass(frozen=True)
class ComposedEvent(PrivacyEvent):
    """Several events on the same data, run one after the other (for example several fits)."""

    events: tuple[PrivacyEvent, ...]
    kind: ClassVar[str] = "composed"

    def __post_init__(self) -> None:
        events = tuple(self.events)
        if not events:
            raise ValueError("a ComposedEvent needs at least one event")
        object.__setattr__(self, "events", events)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "events": [e.to_dict() for e in self.events]}

    @classmethod
    def _from_dict(cls, data: dict[str, Any]) -> ComposedEvent:
        return cls(tuple(event_from_dict(e) for e in data["events"]))


def poisson_subsampled_gaussian(
    noise_multiplier: float,
    sampling_probability: float,
    steps: int,
    relation: NeighbourRelation = NeighbourRelation.ADD_OR_REMOVE_ONE,
) -> PrivacyEvent:
    """The DP-SGD event: ``steps`` Poisson-subsampled Gaussian releases of a sum of per-record
    contributions clipped to norm C, with noise std ``noise_multiplier`` · C.

    Under replace-one the sensitivity is 2C, so the declared Gaussian's multiplier is half
    ``noise_multiplier``, and the sampling is declared centred (see :class:`PoissonSampledEvent`).
    """
    if NeighbourRelation(relation) is NeighbourRelation.REPLACE_ONE:
        gaussian = GaussianEvent(noise_multiplier / 2)
    else:
        gaussian = GaussianEvent(noise_multiplier)
    if sampling_probability == 1:
        return SelfComposedEvent(gaussian, steps)
    return SelfComposedEvent(
        PoissonSampledEvent(sampling_probability, gaussian, centred=True), steps
    )
