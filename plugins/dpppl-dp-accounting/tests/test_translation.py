"""Events translate one to one into dp_accounting's vocabulary; what it would misread is refused."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import dp_accounting as dpa
import pytest

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
from dpppl_dp_accounting.translation import neighboring_relation, to_dp_event

ADD_REMOVE = NeighbourRelation.ADD_OR_REMOVE_ONE
REPLACE = NeighbourRelation.REPLACE_ONE


@dataclass(frozen=True)
class LaplaceEvent(PrivacyEvent):
    """An event kind the plugins do not know (a third party's)."""

    scale: float
    kind: ClassVar[str] = "test_laplace"


def test_every_kind_maps_to_its_counterpart():
    event = ComposedEvent(
        (
            SelfComposedEvent(PoissonSampledEvent(0.01, GaussianEvent(1.1)), 1000),
            SelfComposedEvent(GaussianEvent(5.0), 3),
        )
    )
    subsampled = dpa.PoissonSampledDpEvent(0.01, dpa.GaussianDpEvent(1.1))
    assert to_dp_event(event, ADD_REMOVE) == dpa.ComposedDpEvent(
        [
            dpa.SelfComposedDpEvent(subsampled, 1000),
            dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(5.0), 3),
        ]
    )


def test_sampling_without_replacement_keeps_both_sizes():
    event = SampledWithoutReplacementEvent(1000, 10, GaussianEvent(2.0))
    assert to_dp_event(event, REPLACE) == dpa.SampledWithoutReplacementDpEvent(
        1000, 10, dpa.GaussianDpEvent(2.0)
    )


def test_the_noise_multiplier_scale_reaches_every_gaussian():
    event = ComposedEvent((GaussianEvent(1.0), SelfComposedEvent(GaussianEvent(3.0), 2)))
    assert to_dp_event(event, REPLACE, noise_multiplier_scale=2.0) == dpa.ComposedDpEvent(
        [dpa.GaussianDpEvent(2.0), dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(6.0), 2)]
    )


def test_poisson_subsampling_under_replace_one_is_refused_with_a_reason():
    with pytest.raises(UnsupportedEventError, match="ball around zero"):
        to_dp_event(PoissonSampledEvent(0.1, GaussianEvent(1.0)), REPLACE)


def test_centred_poisson_subsampling_under_replace_one_is_dp_accountings_replace_pair():
    """dp_accounting's REPLACE pair is q·N(±1, s²) + (1 − q)·N(0, s²), s relative to a record's
    norm bound: half the replace-one sensitivity, hence the scale of 2."""
    event = PoissonSampledEvent(0.1, GaussianEvent(1.5), centred=True)
    assert to_dp_event(event, REPLACE, noise_multiplier_scale=2.0) == dpa.PoissonSampledDpEvent(
        0.1, dpa.GaussianDpEvent(3.0)
    )


def test_poisson_sampling_of_everyone_under_replace_one_is_a_plain_release():
    event = PoissonSampledEvent(1.0, GaussianEvent(1.0))
    assert to_dp_event(event, REPLACE) == dpa.PoissonSampledDpEvent(1.0, dpa.GaussianDpEvent(1.0))


def test_an_unknown_event_kind_is_refused_by_name():
    with pytest.raises(UnsupportedEventError, match="LaplaceEvent"):
        to_dp_event(SelfComposedEvent(LaplaceEvent(1.0), 2), ADD_REMOVE)


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (ADD_REMOVE, dpa.NeighboringRelation.ADD_OR_REMOVE_ONE),
        (REPLACE, dpa.NeighboringRelation.REPLACE_ONE),
        ("replace_one", dpa.NeighboringRelation.REPLACE_ONE),
    ],
)
def test_relations_map_by_meaning(ours, theirs):
    assert neighboring_relation(ours) is theirs
