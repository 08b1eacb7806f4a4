"""Translation of dpppl privacy events into dp_accounting's ``DpEvent`` vocabulary.

The two vocabularies match one to one.  The translation refuses, with a reason, what dp_accounting
would account under a different meaning than the event declares.
"""

from __future__ import annotations

import dp_accounting as dpa

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

_RELATIONS = {
    NeighbourRelation.ADD_OR_REMOVE_ONE: dpa.NeighboringRelation.ADD_OR_REMOVE_ONE,
    NeighbourRelation.REPLACE_ONE: dpa.NeighboringRelation.REPLACE_ONE,
}


def neighboring_relation(relation: NeighbourRelation) -> dpa.NeighboringRelation:
    """dp_accounting's name for ``relation``."""
    return _RELATIONS[NeighbourRelation(relation)]


def to_dp_event(
    event: PrivacyEvent, relation: NeighbourRelation, *, noise_multiplier_scale: float = 1.0
) -> dpa.DpEvent:
    """The ``DpEvent`` that describes ``event``.

    Parameters
    ----------
    event
        The event to translate.
    relation
        The neighbour relation it will be accounted under.
    noise_multiplier_scale
        Factor applied to every Gaussian noise multiplier, for accountants whose library measures
        noise against a different unit of sensitivity than dpppl does (see ``PldAccountant``).

    Raises
    ------
    UnsupportedEventError
        For event kinds dp_accounting has no counterpart of, and for Poisson subsampling under
        replace-one unless the event declares centred contributions.
    """
    relation = NeighbourRelation(relation)
    if isinstance(event, GaussianEvent):
        return dpa.GaussianDpEvent(event.noise_multiplier * noise_multiplier_scale)
    if isinstance(event, PoissonSampledEvent):
        replace = relation is NeighbourRelation.REPLACE_ONE and event.sampling_probability < 1
        if replace and not event.centred:
            # Under replace-one the subsampled release depends on how far each record's own
            # contribution lies from the empty sample's, which a noise multiplier measured against
            # the replace-one sensitivity does not say (see PoissonSampledEvent.centred).
            raise UnsupportedEventError(
                "Poisson subsampling under replace_one needs every record's contribution in a ball "
                "around zero (PoissonSampledEvent(..., centred=True)): a noise multiplier relative "
                "to the replace-one sensitivity alone does not determine the subsampled "
                "guarantee; declare it centred if it is, or use add_or_remove_one"
            )
        return dpa.PoissonSampledDpEvent(
            event.sampling_probability,
            to_dp_event(event.event, relation, noise_multiplier_scale=noise_multiplier_scale),
        )
    if isinstance(event, SampledWithoutReplacementEvent):
        return dpa.SampledWithoutReplacementDpEvent(
            event.source_size,
            event.sample_size,
            to_dp_event(event.event, relation, noise_multiplier_scale=noise_multiplier_scale),
        )
    if isinstance(event, SelfComposedEvent):
        return dpa.SelfComposedDpEvent(
            to_dp_event(event.event, relation, noise_multiplier_scale=noise_multiplier_scale),
            event.count,
        )
    if isinstance(event, ComposedEvent):
        return dpa.ComposedDpEvent(
            [
                to_dp_event(e, relation, noise_multiplier_scale=noise_multiplier_scale)
                for e in event.events
            ]
        )
    raise UnsupportedEventError(
        f"dp_accounting has no counterpart of the privacy event {type(event).__name__} "
        f"(kind {getattr(event, 'kind', '?')!r})"
    )
