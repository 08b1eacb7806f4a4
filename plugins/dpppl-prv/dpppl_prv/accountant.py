"""The ``prv`` accountant: privacy random variables on prv-accountant 0.2.0."""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

from dpppl.plugin import (
    Accountant,
    NeighbourRelation,
    PrivacyEvent,
    calibrate_noise_multiplier,
    check_epsilon_delta,
)
from dpppl_dp_accounting.base import check_delta, check_epsilon
from dpppl_dp_accounting.rdp import RdpAccountant
from dpppl_prv.bounds import delta_upper_bound, epsilon_bounds
from dpppl_prv.composition import Composition, composition_of

#: prv-accountant's ``eps_error`` as a fraction of the RDP bound on ε (about 1.1 ε at DP-SGD
#: settings).  The reported bound is the PRV estimate plus ``eps_error``, so this is the price in
#: ε of the PRV method; the grid, and with it time and memory, grows as its inverse.
EPS_ERROR_FRACTION = 0.01
#: Largest ``eps_error``: beyond ε ≈ 10 a relative error would make needlessly loose bounds.
MAX_EPS_ERROR = 0.1
#: Smallest ``eps_error``: the grid grows as its inverse (and with √steps), so below ε ≈ 0.1 the
#: error stays at 0.001 instead of shrinking with ε; at 10^4 steps that caps the grid near 2·10^6.
MIN_EPS_ERROR = 1e-3
#: prv-accountant's ``delta_error`` as a fraction of δ, its own recommendation.
DELTA_ERROR_FRACTION = 1e-3
#: ``delta_error`` when δ is the unknown (:meth:`PrvAccountant.delta`).
DELTA_ERROR_FOR_DELTA = 1e-10
#: Calibration first locates σ on a grid this many times coarser, where a PRV costs a tenth.
COARSE_FACTOR = 10
#: The coarse search aims the predicted bound at [0.992, 0.998]·target, inside the 1 % band with
#: room for the coarse grid's error (below 0.05 % of ε at DP-SGD settings).
PREDICTED_TARGET = 0.998
PREDICTED_RTOL = 0.006


def eps_error(composition: Composition, delta: float) -> float:
    """The ``eps_error`` the ``prv`` accountant uses for ``composition`` at ``delta``."""
    return _clamped(EPS_ERROR_FRACTION * _rdp_epsilon(composition, delta))


def _clamped(error: float) -> float:
    return min(MAX_EPS_ERROR, max(MIN_EPS_ERROR, error))


@lru_cache(maxsize=256)
def _rdp_epsilon(composition: Composition, delta: float) -> float:
    # Subsampled parts exist only under add/remove (composition_of refuses them otherwise), and
    # RDP reads a plain Gaussian the same way under both relations.
    return RdpAccountant().epsilon(
        composition.as_event(), delta=delta, relation=NeighbourRelation.ADD_OR_REMOVE_ONE
    )


@lru_cache(maxsize=64)
def upper_epsilon(composition: Composition, delta: float) -> float:
    """The ``prv`` accountant's bound on ε; cached, since calibration and then the mechanism's
    plan ask for it at the same σ."""
    return epsilon_bounds(
        composition,
        delta=delta,
        eps_error=eps_error(composition, delta),
        delta_error=DELTA_ERROR_FRACTION * delta,
    )[2]


def predicted_upper_epsilon(composition: Composition, delta: float) -> float:
    """:func:`upper_epsilon` predicted from a grid :data:`COARSE_FACTOR` times coarser.

    The PRV estimate barely depends on the grid while the error bound grows with the mesh, so the
    fine bound is predicted as the coarse estimate (at δ - delta_error) plus the fine error.
    """
    fine = eps_error(composition, delta)
    coarse = COARSE_FACTOR * fine
    return (
        epsilon_bounds(
            composition, delta=delta, eps_error=coarse, delta_error=DELTA_ERROR_FRACTION * delta
        )[2]
        - coarse
        + fine
    )


class PrvAccountant(Accountant):
    """Numerical composition of privacy random variables (Gopi, Lee & Wutschitz 2021).

    The accountant of the NA-DPVI paper.  It accounts compositions of Gaussian and
    Poisson-subsampled Gaussian mechanisms, possibly with different noise and sampling rates, and
    reports prv-accountant's upper bound: its estimate plus an error of 1 % of the RDP bound,
    with δ error δ/1000.  That error makes it about 1-2 % looser than ``pld`` at DP-SGD settings,
    and each call takes up to a few seconds; it is here mainly as an independent cross-check.
    """

    name = "prv"
    description = "privacy random variables (prv-accountant 0.2.0); tight up to a 1 % error"

    def check(self, event: PrivacyEvent, relation: NeighbourRelation) -> None:
        composition_of(event, relation)

    def epsilon(self, event: PrivacyEvent, *, delta: float, relation: NeighbourRelation) -> float:
        delta = check_delta(delta)
        return upper_epsilon(composition_of(event, relation), delta)

    def delta(self, event: PrivacyEvent, *, epsilon: float, relation: NeighbourRelation) -> float:
        epsilon = check_epsilon(epsilon)
        composition = composition_of(event, relation)
        # δ is the unknown here, so the ε error is taken relative to the given ε instead.
        return delta_upper_bound(
            composition,
            epsilon=epsilon,
            eps_error=_clamped(EPS_ERROR_FRACTION * epsilon),
            delta_error=DELTA_ERROR_FOR_DELTA,
        )

    def noise_multiplier(
        self,
        event_for: Callable[[float], PrivacyEvent],
        *,
        epsilon: float,
        delta: float,
        relation: NeighbourRelation,
        initial: float = 1.0,
    ) -> float:
        """Calibrated in three stages, each starting where the cheaper one before it ended.

        RDP (milliseconds a call) gives a σ within about 10 %; PRVs on a coarse grid (a tenth of a
        second) locate the σ whose fine bound they predict just inside the band; the fine bound
        (seconds) then confirms it, usually in one call, and keeps searching if it does not.
        """
        epsilon, delta = check_epsilon_delta(epsilon, delta)
        self.check(event_for(initial), relation)
        start = RdpAccountant().noise_multiplier(
            event_for, epsilon=epsilon, delta=delta, relation=relation, initial=initial
        )

        def predicted(sigma: float) -> float:
            return predicted_upper_epsilon(composition_of(event_for(sigma), relation), delta)

        guess = calibrate_noise_multiplier(
            predicted,
            PREDICTED_TARGET * epsilon,
            initial=start,
            rtol=PREDICTED_RTOL,
        )
        return calibrate_noise_multiplier(
            lambda sigma: upper_epsilon(composition_of(event_for(sigma), relation), delta),
            epsilon,
            initial=guess,
        )
