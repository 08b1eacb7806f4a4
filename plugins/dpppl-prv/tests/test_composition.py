"""Events reduce to the PRVs prv-accountant has: one folded Gaussian and counted subsampled ones."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

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
    poisson_subsampled_gaussian,
)
from dpppl_dp_accounting.rdp import RdpAccountant
from dpppl_prv.composition import Composition, composition_of

ADD_REMOVE = NeighbourRelation.ADD_OR_REMOVE_ONE
REPLACE = NeighbourRelation.REPLACE_ONE


@dataclass(frozen=True)
class CountingQueryEvent(PrivacyEvent):
    """An event kind the prv plugin does not know (a third party's)."""

    kind: ClassVar[str] = "test_counting_query"


def test_repeated_gaussians_fold_into_one_with_their_squared_ratios_added():
    event = ComposedEvent((SelfComposedEvent(GaussianEvent(10.0), 100), GaussianEvent(2.0)))
    composition = composition_of(event, ADD_REMOVE)
    assert composition.gaussian_mu_squared == pytest.approx(100 / 10.0**2 + 1 / 2.0**2)
    assert composition.subsampled == ()
    assert composition.gaussian_noise_multiplier == pytest.approx((1.25) ** -0.5)


def test_subsampled_releases_are_counted_per_rate_and_noise():
    first = poisson_subsampled_gaussian(2.0, 0.01, 300)
    second = poisson_subsampled_gaussian(3.0, 0.05, 100)
    composition = composition_of(ComposedEvent((first, second, first)), ADD_REMOVE)
    assert composition == Composition(0.0, ((0.01, 2.0, 600), (0.05, 3.0, 100)))
    assert composition.gaussian_noise_multiplier is None


def test_equal_compositions_in_any_order_are_equal_and_hash_alike():
    a = poisson_subsampled_gaussian(2.0, 0.01, 3)
    b = poisson_subsampled_gaussian(3.0, 0.05, 1)
    one = composition_of(ComposedEvent((a, b)), ADD_REMOVE)
    other = composition_of(ComposedEvent((b, a)), ADD_REMOVE)
    assert one == other and hash(one) == hash(other)


def test_gaussians_released_on_one_subsample_act_as_one_gaussian():
    event = PoissonSampledEvent(0.1, ComposedEvent((GaussianEvent(3.0), GaussianEvent(4.0))))
    # 1/3² + 1/4² = 1/(12/5)²: one Gaussian with noise multiplier 2.4.
    assert composition_of(event, ADD_REMOVE).subsampled == ((0.1, pytest.approx(2.4), 1),)


def test_sampling_everyone_is_a_plain_gaussian_under_either_relation():
    event = PoissonSampledEvent(1.0, GaussianEvent(2.0))
    for relation in NeighbourRelation:
        assert composition_of(event, relation) == Composition(0.25, ())


def test_the_equivalent_event_has_the_same_rdp_epsilon():
    event = ComposedEvent(
        (poisson_subsampled_gaussian(2.0, 0.01, 300), SelfComposedEvent(GaussianEvent(20.0), 4))
    )
    rdp = RdpAccountant()
    folded = composition_of(event, ADD_REMOVE).as_event()
    assert rdp.epsilon(folded, delta=1e-5, relation=ADD_REMOVE) == pytest.approx(
        rdp.epsilon(event, delta=1e-5, relation=ADD_REMOVE), rel=1e-12
    )


@pytest.mark.parametrize(
    ("event", "relation", "reason"),
    [
        (
            SampledWithoutReplacementEvent(100, 10, GaussianEvent(1.0)),
            REPLACE,
            "without replacement",
        ),
        (poisson_subsampled_gaussian(1.0, 0.1, 10), REPLACE, "add_or_remove_one"),
        (SelfComposedEvent(CountingQueryEvent(), 3), ADD_REMOVE, "CountingQueryEvent"),
        (
            PoissonSampledEvent(0.5, PoissonSampledEvent(0.5, GaussianEvent(1.0))),
            ADD_REMOVE,
            "only Gaussian releases",
        ),
    ],
    ids=["without-replacement", "poisson-replace-one", "unknown-kind", "poisson-of-poisson"],
)
def test_what_has_no_prv_is_refused_with_a_reason(event, relation, reason):
    with pytest.raises(UnsupportedEventError, match=reason):
        composition_of(event, relation)
