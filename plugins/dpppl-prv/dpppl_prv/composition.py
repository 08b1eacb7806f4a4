"""The privacy random variables of an event: what prv-accountant composes.

prv-accountant has PRVs for the Gaussian and the Poisson-subsampled Gaussian mechanism, so an
event is reduced to those: every non-subsampled Gaussian release (however nested and repeated) is
folded into one Gaussian, exactly, since composing Gaussian mechanisms adds their squared
sensitivity-to-noise ratios; Poisson-subsampled Gaussians are grouped by (q, σ) and counted.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from dpppl.plugin import (
    ComposedEvent,
    GaussianEvent,
    NeighbourRelation,
    PoissonSampledEvent,
    PrivacyEvent,
    SampledWithoutReplacementEvent,
    SelfComposedEvent,
    UnsupportedEventError,
)


@dataclass(frozen=True)
class Composition:
    """A composition of Gaussian and Poisson-subsampled Gaussian mechanisms.

    Attributes
    ----------
    gaussian_mu_squared
        Sum over the non-subsampled Gaussian releases of 1/σ²: together they are one Gaussian
        mechanism with noise multiplier ``gaussian_mu_squared ** -0.5`` (0 when there are none).
    subsampled
        ``(sampling_probability, noise_multiplier, count)`` for each distinct subsampled release,
        sorted, so that equal compositions compare and hash equal.
    """

    gaussian_mu_squared: float
    subsampled: tuple[tuple[float, float, int], ...]

    @property
    def gaussian_noise_multiplier(self) -> float | None:
        """Noise multiplier of the folded Gaussian, or None when there is none."""
        if self.gaussian_mu_squared == 0:
            return None
        return 1 / math.sqrt(self.gaussian_mu_squared)

    def as_event(self) -> PrivacyEvent:
        """An event with the same privacy loss, in the core's vocabulary."""
        parts: list[PrivacyEvent] = []
        if self.gaussian_noise_multiplier is not None:
            parts.append(GaussianEvent(self.gaussian_noise_multiplier))
        parts.extend(
            SelfComposedEvent(PoissonSampledEvent(q, GaussianEvent(sigma)), count)
            for q, sigma, count in self.subsampled
        )
        return ComposedEvent(tuple(parts))


def composition_of(event: PrivacyEvent, relation: NeighbourRelation) -> Composition:
    """The :class:`Composition` that ``event`` releases.

    Raises
    ------
    UnsupportedEventError
        For sampling without replacement, Poisson subsampling under replace-one, Poisson
        subsampling of anything but Gaussian releases, and event kinds unknown here.
    """
    relation = NeighbourRelation(relation)
    mu_squared = 0.0
    subsampled: Counter[tuple[float, float]] = Counter()

    def visit(event: PrivacyEvent, count: int) -> None:
        nonlocal mu_squared
        if isinstance(event, SelfComposedEvent):
            visit(event.event, count * event.count)
        elif isinstance(event, ComposedEvent):
            for part in event.events:
                visit(part, count)
        elif isinstance(event, GaussianEvent):
            mu_squared += count / event.noise_multiplier**2
        elif isinstance(event, PoissonSampledEvent):
            q = event.sampling_probability
            inner = _gaussian_mu_squared(event.event)
            if q == 1:
                mu_squared += count * inner
                return
            if relation is NeighbourRelation.REPLACE_ONE:
                raise UnsupportedEventError(
                    "prv-accountant's subsampled Gaussian PRV is the add/remove one: account "
                    "Poisson subsampling under add_or_remove_one"
                )
            subsampled[(q, 1 / math.sqrt(inner))] += count
        elif isinstance(event, SampledWithoutReplacementEvent):
            raise UnsupportedEventError(
                "prv-accountant has no privacy random variable for sampling without replacement; "
                "use accountant='rdp' (under replace_one)"
            )
        else:
            raise UnsupportedEventError(
                f"the prv accountant does not know the privacy event {type(event).__name__} "
                f"(kind {getattr(event, 'kind', '?')!r})"
            )

    visit(event, 1)
    return Composition(
        gaussian_mu_squared=mu_squared,
        subsampled=tuple(sorted((q, sigma, n) for (q, sigma), n in subsampled.items())),
    )


def _gaussian_mu_squared(event: PrivacyEvent) -> float:
    """Σ 1/σ² of the Gaussian releases inside a Poisson-subsampled event, all on one sample."""
    if isinstance(event, GaussianEvent):
        return 1 / event.noise_multiplier**2
    if isinstance(event, SelfComposedEvent):
        return event.count * _gaussian_mu_squared(event.event)
    if isinstance(event, ComposedEvent):
        return sum(_gaussian_mu_squared(part) for part in event.events)
    raise UnsupportedEventError(
        "prv-accountant subsamples only Gaussian releases; found "
        f"{type(event).__name__} inside a Poisson-subsampled event"
    )
