"""Privacy events describe a release and survive a JSON round trip."""

from __future__ import annotations

import pytest

from dpppl.privacy.events import (
    ComposedEvent,
    GaussianEvent,
    NeighbourRelation,
    PoissonSampledEvent,
    SampledWithoutReplacementEvent,
    SelfComposedEvent,
    event_from_dict,
    event_from_json,
    poisson_subsampled_gaussian,
)


def test_events_round_trip_through_json():
    event = ComposedEvent(
        (
            poisson_subsampled_gaussian(1.1, 0.01, 1000),
            SelfComposedEvent(SampledWithoutReplacementEvent(100, 5, GaussianEvent(2.0)), 3),
        )
    )
    assert event_from_json(event.to_json()) == event


def test_the_dp_sgd_event_is_a_self_composed_poisson_sampled_gaussian():
    """Clipped per-record gradients lie in the ball of radius C around zero: declared centred."""
    assert poisson_subsampled_gaussian(1.5, 0.04, 2250) == SelfComposedEvent(
        PoissonSampledEvent(0.04, GaussianEvent(1.5), centred=True), 2250
    )
    assert poisson_subsampled_gaussian(2.0, 1.0, 10) == SelfComposedEvent(GaussianEvent(2.0), 10)


def test_under_replace_one_the_dp_sgd_event_halves_the_multiplier_for_the_doubled_sensitivity():
    relation = NeighbourRelation.REPLACE_ONE
    assert poisson_subsampled_gaussian(3.0, 0.04, 20, relation) == SelfComposedEvent(
        PoissonSampledEvent(0.04, GaussianEvent(1.5), centred=True), 20
    )


def test_an_event_without_the_centred_declaration_reads_back_as_not_centred():
    """Events stored before the declaration existed (in ledgers) keep their meaning."""
    stored = {"kind": "poisson_sampled", "sampling_probability": 0.1,
              "event": {"kind": "gaussian", "noise_multiplier": 1.0}}
    assert event_from_dict(stored) == PoissonSampledEvent(0.1, GaussianEvent(1.0))
    centred = PoissonSampledEvent(0.1, GaussianEvent(1.0), centred=True)
    assert event_from_json(centred.to_json()) == centred


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: GaussianEvent(0.0), "noise_multiplier must be positive"),
        (lambda: GaussianEvent(float("nan")), "noise_multiplier must be positive"),
        (lambda: PoissonSampledEvent(1.5, GaussianEvent(1.0)), r"sampling_probability must be in \(0, 1\]"),
        (lambda: SelfComposedEvent(GaussianEvent(1.0), 0), "count must be a positive integer"),
        (lambda: SampledWithoutReplacementEvent(5, 6, GaussianEvent(1.0)), "cannot exceed"),
        (lambda: ComposedEvent(()), "at least one event"),
    ],
)
def test_invalid_events_are_refused(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_unknown_event_kinds_are_refused():
    with pytest.raises(ValueError, match="unknown privacy event kind 'laplace'"):
        event_from_json('{"kind": "laplace"}')
