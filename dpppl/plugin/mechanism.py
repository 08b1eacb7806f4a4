"""The mechanism interface: what a mechanism plugin implements and what it hands back.

A mechanism is a class registered through the ``register_mechanisms`` hook.  dpppl calls it in two
steps, so that every refusal and the whole privacy calculation happen before the data are touched:

1. :meth:`Mechanism.plan` turns the user's (ε, δ) and the public size of the data set into a
   :class:`PrivacyPlan`: the declared privacy event, calibrated by an accountant.
2. :meth:`Mechanism.fit` runs on the private records and returns a :class:`Release`: posterior draws
   in the unconstrained space plus any other groups the guarantee covers.

The core turns the release into an ArviZ ``DataTree``; it never looks at the data itself.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import sys
import warnings
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from dpppl.plugin.options import check_options
from dpppl.privacy.events import NeighbourRelation, PrivacyEvent

if TYPE_CHECKING:
    # Annotations only: the plugin listing reads Mechanism subclasses without loading these.
    import numpy as np
    import xarray as xr

    from dpppl.model.record_model import RecordModel
    from dpppl.plugin.accountant import Accountant
    from dpppl.progress import Progress

#: Guarantee kind of mechanisms whose (ε, δ) comes from an accountant.
APPROXIMATE_DP = "(epsilon, delta)-DP"


@dataclass(frozen=True)
class PrivacyPlan:
    """The guarantee a fit will have, fixed before it touches the data.

    Attributes
    ----------
    epsilon, delta
        The guarantee: ε is the accountant's upper bound at δ for ``event``.
    relation
        The neighbour relation the guarantee holds under.
    event
        The declared privacy event, or None for guarantees no accountant composes (for example the
        pseudo posterior mechanism's probabilistic DP).
    accountant
        Name of the accountant that calibrated and bounded ``event``.
    noise_multiplier
        The calibrated σ (noise standard deviation over L2 sensitivity), if the mechanism adds
        Gaussian noise.
    guarantee
        What kind of guarantee this is, in words (``"(epsilon, delta)-DP"`` for accounted ones).
    details
        Other public facts of the plan (sampling rate, steps, sensitivity...), JSON-compatible.
    extra_delta
        The part of ``delta`` the mechanism spends outside ``event``, for example on batches it
        truncates to a fixed shape: ``epsilon`` is the accountant's bound for ``event`` at
        ``delta - extra_delta``.  A ledger composes its events at its own δ less the sum of these.
        It is a total-variation term, (1 + e^ε)·η for a mechanism within total variation η of the
        declared one, reported at ``epsilon``; a ledger takes η back out of it and converts it at
        the ε it claims for all its fits together.
    max_divergence
        γ ≥ 0 where the mechanism's output law is, for every data set, within a factor e^(±γ)
        of one that the declared event and ``extra_delta`` cover (for example noise whose
        floating-point sampler has a bounded relative error): ``epsilon`` is then the
        accountant's bound for ``event`` at (``delta`` − ``extra_delta``)·e^(−γ), plus 2γ.  A
        ledger adds the 2γ of its fits to the ε it claims and scales its events' δ by e^(−Σγ).
    """

    epsilon: float
    delta: float
    relation: NeighbourRelation
    event: PrivacyEvent | None
    accountant: str | None
    noise_multiplier: float | None = None
    guarantee: str = APPROXIMATE_DP
    details: dict[str, Any] = field(default_factory=dict)
    extra_delta: float = 0.0
    max_divergence: float = 0.0

    @property
    def event_delta(self) -> float:
        """The δ at which ``event`` alone is accounted: (δ − extra_delta)·e^(−max_divergence)."""
        return (self.delta - self.extra_delta) * math.exp(-self.max_divergence)


@dataclass
class Release:
    """What a mechanism hands back: only DP releases and public metadata.

    Attributes
    ----------
    draws
        Posterior draws of the unconstrained parameter vector θ, shape (chain, draw, n_params).
        The core maps them to the model's named, constrained variables.
    groups
        Further groups for the result, e.g. the released DP-SGD traces or the sampler statistics
        of a post-processing model.  They must be functions of the DP release alone.
    attrs
        Public settings the mechanism chose while fitting (derived step sizes, clipping bound...).
    privacy
        Corrections to the plan known only after the fit (for example the achieved ε of a
        mechanism whose guarantee depends on the data), with the same keys as :class:`PrivacyPlan`.
    warnings
        What the user should know about the quality of this fit (for example divergent
        transitions of a post-processing sampler), one message each.  ``dpppl.sample`` shows
        them as warnings; a replicate study counts the fits that have any.
    """

    draws: np.ndarray
    groups: dict[str, xr.Dataset] = field(default_factory=dict)
    attrs: dict[str, Any] = field(default_factory=dict)
    privacy: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def warn_user(message: str, category: type[Warning] = UserWarning) -> None:
    """Warn from a plugin, naming the user's line rather than dpppl's or the plugin's.

    Every frame in dpppl's package or in the calling plugin's top-level package is skipped,
    however deep the call (a mechanism's ``check_model`` runs several frames below
    ``dpppl.sample``), so the warning points at the user's script, as PyMC's do.
    """
    caller = sys._getframe(1).f_globals.get("__name__", "").partition(".")[0]
    warnings.warn(
        message, category, skip_file_prefixes=_package_files("dpppl") + _package_files(caller)
    )


def _package_files(name: str) -> tuple[str, ...]:
    """Path prefixes of the files of package ``name``, or of its one file (none if it is not
    importable).

    Folders end in a separator, so that ``.../dpppl`` does not also cover a user's
    ``.../dpppl_analysis.py``.  A one-file module is matched by its path up to the suffix's dot:
    CPython 3.12's ``skip_file_prefixes`` compares each prefix with a frame's file name less its
    last character, so the whole file name would never match.
    """
    spec = importlib.util.find_spec(name) if name else None
    if spec is None:
        return ()
    if spec.submodule_search_locations:
        return tuple(os.path.join(folder, "") for folder in spec.submodule_search_locations)
    if spec.origin is None or not os.path.isfile(spec.origin):
        return ()
    return (os.path.splitext(spec.origin)[0] + ".",)


class Mechanism(ABC):
    """Interface of a mechanism plugin.

    Subclasses set :attr:`name`, describe their options as a dataclass in :attr:`Options`, and
    implement :meth:`fit` and either :meth:`privacy_event` (Gaussian-noise mechanisms: the core's
    :meth:`plan` calibrates it with the accountant) or :meth:`plan` itself.

    Options are keyword arguments of ``dpppl.sample``; unknown ones are refused with the list of
    valid ones, and values are checked against the ``Options`` annotations (``Literal`` choices,
    ``int``, ``float``, ``None`` where allowed, ranges given as ``Annotated[float, Interval(...)]``;
    see :mod:`dpppl.plugin.options`) before any budget is spent.  Rules that tie options together go in
    ``Options.__post_init__`` and raise :class:`~dpppl.InvalidOptionError`.
    """

    #: The name users pass as ``mechanism=``.
    name: ClassVar[str]
    #: One line for ``dpppl plugins``.
    description: ClassVar[str] = ""
    #: Neighbour relation of the guarantee.
    relation: ClassVar[NeighbourRelation] = NeighbourRelation.ADD_OR_REMOVE_ONE
    #: Accountants to use, in order of preference, when the user names none.
    preferred_accountants: ClassVar[tuple[str, ...]] = ("pld", "rdp", "prv")

    @dataclass(frozen=True)
    class Options:
        """The mechanism's options (none by default)."""

    def __init__(self, **options: Any):
        valid = {f.name for f in dataclasses.fields(self.Options)}
        unknown = sorted(set(options) - valid)
        if unknown:
            raise TypeError(
                f"mechanism {self.name!r} has no option(s) {unknown}; its options are "
                f"{sorted(valid) or 'none'}"
            )
        check_options(self.name, self.Options, options)
        self.options = self.Options(**options)

    def settings(self) -> dict[str, Any]:
        """The options as a JSON-compatible dict, for the result's metadata."""
        return json.loads(json.dumps(dataclasses.asdict(self.options), default=str))

    def check_model(self, model: RecordModel) -> None:
        """Refuse a model this mechanism cannot handle (raise ModelNotSupportedError)."""

    def privacy_event(self, *, n_records: int, noise_multiplier: float) -> PrivacyEvent:
        """The event a fit on ``n_records`` records releases at noise multiplier σ."""
        raise NotImplementedError(
            f"mechanism {self.name!r} must implement privacy_event() or plan()"
        )

    def noise_multiplier_guess(self, *, n_records: int, epsilon: float, delta: float) -> float:
        """A first guess of σ to start calibration from (a good one saves accountant calls)."""
        return 1.0

    def plan(
        self, *, n_records: int, epsilon: float, delta: float, accountant: Accountant | None
    ) -> PrivacyPlan:
        """Calibrate the noise so the accountant's upper bound on ε is at most ``epsilon``.

        ``accountant`` is None only for mechanisms with no preferred accountant, which must
        override this method.
        """
        if accountant is None:
            raise NotImplementedError(
                f"mechanism {self.name!r} has no accountant and must implement plan() itself"
            )

        def event_for(sigma: float) -> PrivacyEvent:
            return self.privacy_event(n_records=n_records, noise_multiplier=sigma)

        sigma = accountant.noise_multiplier(
            event_for,
            epsilon=epsilon,
            delta=delta,
            relation=self.relation,
            initial=self.noise_multiplier_guess(
                n_records=n_records, epsilon=epsilon, delta=delta
            ),
        )
        event = event_for(sigma)
        return PrivacyPlan(
            epsilon=accountant.epsilon(event, delta=delta, relation=self.relation),
            delta=delta,
            relation=self.relation,
            event=event,
            accountant=accountant.name,
            noise_multiplier=sigma,
        )

    @abstractmethod
    def fit(
        self,
        model: RecordModel,
        data: Mapping[str, np.ndarray],
        plan: PrivacyPlan,
        *,
        seed: np.random.SeedSequence,
        progress: Progress,
    ) -> Release:
        """Run the mechanism on the private ``data`` and return what it releases.

        Parameters
        ----------
        model
            The compiled record model; its functions take batches of ``data``.
        data
            The private record arrays, keyed by ``model.record_names``, all of length N.
        plan
            The calibrated plan from :meth:`plan`.
        seed
            Entropy for every random draw of the fit (OS entropy unless the user fixed a seed).
        progress
            Report long loops through ``progress.task(description, total)``.
        """

    def replicate_batch_size(self, model: RecordModel, plan: PrivacyPlan) -> int:
        """The most replicates :meth:`fit_replicates` should be given at once (1: no gain from
        more).  A vectorised mechanism sizes its batches to the memory of JAX's default device
        here.  A study cuts its replicates into the fewest equal batches within this limit and
        fills the last up to their size, so every batch it hands over has one size."""
        return 1

    def fit_replicates(
        self,
        model: RecordModel,
        datasets: Sequence[Mapping[str, np.ndarray]],
        plan: PrivacyPlan,
        *,
        seeds: Sequence[np.random.SeedSequence],
        progress: Progress,
    ) -> list[Release]:
        """Fit independent replicates of a simulation study, one release per data set.

        Each replicate must be distributed exactly as ``fit(model, data, plan, seed=seed)``: the
        same algorithm, plan and settings rules, with independent randomness (its random stream
        may differ from a single fit's).  Replicate studies (:func:`dpppl.tarp`) call this on
        simulated data only.  This default runs :meth:`fit` once per data set and keeps each
        fit's warnings in its :attr:`Release.warnings`; override it to run the replicates as
        one vectorised program.
        """
        releases = []
        for data, seed in zip(datasets, seeds, strict=True):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                release = self.fit(model, data, plan, seed=seed, progress=progress)
            release.warnings.extend(f"{w.category.__name__}: {w.message}" for w in caught)
            releases.append(release)
        return releases
