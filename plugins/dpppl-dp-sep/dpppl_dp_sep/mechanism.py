"""The DP-SEP mechanism: differentially private stochastic expectation propagation.

Reference: Vinaroz & Park, "Differentially private stochastic expectation propagation", TMLR 2022
(Algorithm 3, Sections 3-4 and 6).  The engine is :mod:`dpppl_dp_sep.sep`.

**The privacy event.**  Every step draws m records uniformly without replacement, independently
of the other steps, and releases the global site's natural parameters (η, Λ) with Gaussian noise.
Under replace-one neighbours (data sets of the same public size N differing in one record) a
record in the sample changes the release by (γ/N)(θ_{g_n} − θ_{g_n'}), of norm at most 2γC/N in
each block because both effective sites are clipped to C: the paper's Proposition 1.  The noise on
each block's coordinates has standard deviation σ·2γC/N.  The two blocks together are one
Gaussian release of L2 sensitivity √2·2γC/N at noise multiplier σ/√2, so the event is

    SelfComposed(SampledWithoutReplacement(N, m, Gaussian(σ/√2)), T)

which the ``rdp`` accountant bounds with the subsampled-RDP bound of Wang, Balle & Kasiviswanathan
(2019) for exactly this sampling and relation.  The paper accounts its sweeps over shuffled
records with that bound; here the sampling is what the bound describes.  σ, the noise multiplier
of each block, is what the plan reports.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Annotated, Literal

import numpy as np
import xarray as xr

from dpppl.plugin import (
    NON_NEGATIVE,
    POSITIVE,
    Accountant,
    GaussianEvent,
    Interval,
    InvalidOptionError,
    Mechanism,
    ModelNotSupportedError,
    NeighbourRelation,
    PrivacyEvent,
    PrivacyPlan,
    Progress,
    RecordModel,
    Release,
    SampledWithoutReplacementEvent,
    SelfComposedEvent,
    jax_key,
)
from dpppl_dp_sep.families import Natural
from dpppl_dp_sep.moments import GaussHermite, MonteCarlo, NodeRule, Spherical
from dpppl_dp_sep.prior import prior_mode
from dpppl_dp_sep.sep import SEPResult, SEPSettings, run_sep

#: Largest dimension that ``covariance="auto"`` gives a full covariance matrix.
AUTO_FULL_MAX_PARAMS = 64
#: Largest dimension that ``moment_matching="auto"`` handles by Gauss–Hermite cubature.
AUTO_CUBATURE_MAX_PARAMS = 2
#: Largest dimension that ``moment_matching="auto"`` handles by the spherical rule (2d nodes).
AUTO_SPHERICAL_MAX_PARAMS = 64
#: Largest number of moment-matching nodes accepted (Gauss–Hermite grows as order**d).
MAX_NODES = 4096
#: Largest dimension accepted for a full covariance (a step costs O(d³), a record O(d²) per node).
MAX_FULL_PARAMS = 256


class DPSEP(Mechanism):
    """Differentially private stochastic expectation propagation (DP-SEP).

    A Gaussian approximation q(θ) = p̂₀(θ) f(θ)^N over the model's unconstrained parameters, with
    one global site f refined by SEP from uniformly sampled records.  Each record's site is found
    by moment matching its tilted distribution with the model's own log-likelihood, clipped per
    natural-parameter block to norm C, and every update of f is released with Gaussian noise of
    standard deviation σ·2γC/N; the precision is projected back to positive definite after each
    release.  The posterior is drawn from the final private Gaussian.

    Options
    -------
    passes
        Expected passes over the data: T = ⌈passes · N / batch_size⌉ steps (paper: 100 for the
        mixture, 40 for the networks).
    batch_size
        m, records drawn uniformly without replacement at each step (paper: 1).
    damping
        γ: a sampled record moves the global site γ/N of the way to its own site (paper: 1).
    clipping_bound
        C, the norm bound of each natural-parameter block of a record's site and of the global
        site (paper: 1).
    covariance
        ``"full"``, ``"diagonal"`` or ``"auto"`` (full up to 64 parameters).
    moment_matching
        ``"cubature"`` (Gauss–Hermite product rule), ``"spherical"`` (randomly rotated degree-3
        rule, 2d nodes), ``"monte-carlo"`` (antithetic draws) or ``"auto"`` (cubature up to 2
        parameters, spherical up to 64, Monte Carlo above).
    cubature_order
        Gauss–Hermite points per dimension.
    mc_draws
        Monte Carlo nodes per step (antithetic pairs, so even).
    average_last
        Fraction of the steps at the end whose released sites are averaged into the result
        (post-processing of the release; 0 keeps the last step's, as the paper does).
    precision_floor
        Eigenvalue floor of the released precision, as a multiple of the prior site's smallest
        precision eigenvalue.
    init_jitter
        Start from N(μ₀ + init_jitter · z, Σ₀) with z a standard normal draw in the prior's
        whitened coordinates, to leave symmetric points (exchangeable mixture components, hidden
        units).  0 starts at the prior.
    noise_floor
        The precision's eigenvalue floor is raised to this multiple of the expected largest
        eigenvalue of the noise accumulated in it (a public function of σ, C, γ, N, m and the step
        count; see :func:`dpppl_dp_sep.sep.noise_level`), so that directions the noise swamps
        cannot throw q's mean away.  0 keeps the prior floor alone.
    draws, chains
        Posterior draws from the final Gaussian.
    """

    name = "dp-sep"
    description = "DP stochastic expectation propagation (Gaussian over unconstrained parameters)"
    relation = NeighbourRelation.REPLACE_ONE
    #: Only RDP accounts sampling without replacement (under replace-one).
    preferred_accountants = ("rdp",)

    @dataclass(frozen=True)
    class Options:
        passes: Annotated[float, POSITIVE] = 20.0
        batch_size: Annotated[int, POSITIVE] = 1
        damping: Annotated[float, POSITIVE] = 1.0
        clipping_bound: Annotated[float, POSITIVE] = 1.0
        covariance: Literal["auto", "full", "diagonal"] = "auto"
        moment_matching: Literal["auto", "cubature", "spherical", "monte-carlo"] = "auto"
        cubature_order: Annotated[int, POSITIVE] = 8
        mc_draws: Annotated[int, POSITIVE] = 32
        average_last: Annotated[float, Interval(0, 1, high_open=True)] = 0.5
        precision_floor: Annotated[float, POSITIVE] = 1.0
        init_jitter: Annotated[float, NON_NEGATIVE] = 0.1
        noise_floor: Annotated[float, NON_NEGATIVE] = 1.0
        draws: Annotated[int, POSITIVE] = 1000
        chains: Annotated[int, POSITIVE] = 4

        def __post_init__(self) -> None:
            if self.mc_draws % 2:
                raise InvalidOptionError(
                    f"dp-sep option mc_draws must be even (antithetic pairs), got {self.mc_draws}"
                )

    # -- schedule ---------------------------------------------------------------------------------

    def steps(self, n_records: int) -> int:
        """T = ⌈passes · N / m⌉."""
        o = self.options
        return math.ceil(o.passes * n_records / o.batch_size - 1e-9)

    def sensitivity(self, n_records: int) -> float:
        """2γC/N: the L2 sensitivity of each natural-parameter block of a release."""
        o = self.options
        return 2 * o.damping * o.clipping_bound / n_records

    def covariance(self, n_params: int) -> str:
        """The family ``covariance="auto"`` resolves to for ``n_params`` parameters."""
        if self.options.covariance != "auto":
            return self.options.covariance
        return "full" if n_params <= AUTO_FULL_MAX_PARAMS else "diagonal"

    def nodes(self, n_params: int) -> NodeRule:
        """The moment-matching node rule for ``n_params`` parameters."""
        o = self.options
        method = o.moment_matching
        if method == "auto":
            if n_params <= AUTO_CUBATURE_MAX_PARAMS:
                method = "cubature"
            elif n_params <= AUTO_SPHERICAL_MAX_PARAMS:
                method = "spherical"
            else:
                method = "monte-carlo"
        if method == "cubature":
            return GaussHermite(o.cubature_order)
        if method == "spherical":
            return Spherical()
        return MonteCarlo(o.mc_draws)

    def check_model(self, model: RecordModel) -> None:
        """Refuse, before any budget is spent, a batch larger than the data, a full covariance
        or a node rule too large for the model, and a prior with no Gaussian approximation."""
        d = model.n_params
        if self.options.batch_size > model.n_records:
            raise InvalidOptionError(
                f"dp-sep option batch_size ({self.options.batch_size}) exceeds the number of "
                f"records ({model.n_records})"
            )
        if self.covariance(d) == "full" and d > MAX_FULL_PARAMS:
            raise ModelNotSupportedError(
                f"dp-sep with covariance='full' is limited to {MAX_FULL_PARAMS} parameters; this "
                f"model has {d}. Use covariance='diagonal'"
            )
        nodes = self.nodes(d)
        if nodes.n_nodes(d) > MAX_NODES:
            raise ModelNotSupportedError(
                f"moment matching by {nodes.name!r} needs {nodes.n_nodes(d)} nodes for this "
                f"model's {d} parameters (at most {MAX_NODES}); use "
                "moment_matching='monte-carlo'"
            )
        prior_mode(model)

    # -- privacy ----------------------------------------------------------------------------------

    def privacy_event(self, *, n_records: int, noise_multiplier: float) -> PrivacyEvent:
        """T releases of (η, Λ), each on m records sampled without replacement, at noise
        multiplier σ/√2 (two blocks of sensitivity 2γC/N with noise σ·2γC/N on each)."""
        release = GaussianEvent(noise_multiplier / math.sqrt(2))
        m = self.options.batch_size
        if m < n_records:
            release = SampledWithoutReplacementEvent(n_records, m, release)
        return SelfComposedEvent(release, self.steps(n_records))

    def noise_multiplier_guess(self, *, n_records: int, epsilon: float, delta: float) -> float:
        # The moments-accountant scaling q √(T log(1/δ)) / ε of the joint noise multiplier
        # (q = m/N), times √2 for the per-block one; the accountant refines it.
        q = self.options.batch_size / n_records
        return max(
            math.sqrt(2) * q * math.sqrt(self.steps(n_records) * math.log(1 / delta)) / epsilon,
            0.5,
        )

    def plan(
        self, *, n_records: int, epsilon: float, delta: float, accountant: Accountant
    ) -> PrivacyPlan:
        """The core's calibration, with the public schedule in the plan's details."""
        accounted = super().plan(
            n_records=n_records, epsilon=epsilon, delta=delta, accountant=accountant
        )
        sensitivity = self.sensitivity(n_records)
        return dataclasses.replace(
            accounted,
            details={
                "steps": self.steps(n_records),
                "sampling": "uniform without replacement, independently at every step",
                "batch_size": self.options.batch_size,
                "block_sensitivity": sensitivity,
                "noise_std": accounted.noise_multiplier * sensitivity,
                "event_noise_multiplier": accounted.noise_multiplier / math.sqrt(2),
                "releases": "noisy natural parameters (eta, precision) of the global site after "
                "every step; per-block sensitivity 2*damping*C/N under replace-one",
            },
        )

    # -- fitting ----------------------------------------------------------------------------------

    def engine_settings(self, model: RecordModel, noise_std: float) -> SEPSettings:
        """The engine's settings for a fit of ``model`` with noise of standard deviation
        ``noise_std`` on every released coordinate (the plan's; 0 runs clipped SEP, a
        non-private baseline)."""
        o = self.options
        return SEPSettings(
            covariance=self.covariance(model.n_params),
            nodes=self.nodes(model.n_params),
            steps=self.steps(model.n_records),
            batch_size=o.batch_size,
            damping=o.damping,
            clipping_bound=o.clipping_bound,
            noise_std=noise_std,
            precision_floor=o.precision_floor,
            average_last=o.average_last,
            init_jitter=o.init_jitter,
            noise_floor=o.noise_floor,
        )

    def fit(
        self,
        model: RecordModel,
        data: dict[str, np.ndarray],
        plan: PrivacyPlan,
        *,
        seed: np.random.SeedSequence,
        progress: Progress,
    ) -> Release:
        seed_sep, seed_draws = seed.spawn(2)
        settings = self.engine_settings(model, plan.details["noise_std"])
        result = run_sep(
            model, data, settings, key=jax_key(seed_sep), progress=progress, label="DP-SEP"
        )
        o = self.options
        draws = result.family.sample(
            result.approximation, np.random.default_rng(seed_draws), (o.chains, o.draws)
        )
        return Release(
            draws=draws,
            groups={
                "dpsep_approximation": approximation_dataset(model, result),
                "dpsep_trace": trace_dataset(model, result),
            },
            attrs={
                "covariance": settings.covariance,
                "moment_matching": settings.nodes.name,
                "nodes_per_step": settings.nodes.n_nodes(model.n_params),
                "steps": settings.steps,
                "noise_std": settings.noise_std,
                "precision_floor": float(result.floor),
                "prior_site": "Laplace approximation of the log prior; the residual is shared "
                "among the records' tilted distributions",
            },
        )


def _labels(model: RecordModel) -> list[str]:
    return model.parameters.labels()


def approximation_dataset(model: RecordModel, result: SEPResult) -> xr.Dataset:
    """The final private Gaussian over θ: natural parameters and moments (a DP release)."""
    labels = _labels(model)
    q = result.approximation
    mean, spread = result.family.moments(q)
    if result.family.name == "full":
        second = {
            "precision": (("param", "param_"), q.precision),
            "covariance": (("param", "param_"), spread),
        }
        coords = {"param": labels, "param_": labels}
    else:
        second = {"precision": (("param",), q.precision), "variance": (("param",), spread)}
        coords = {"param": labels}
    return xr.Dataset(
        {"eta": (("param",), q.eta), "mean": (("param",), mean), **second},
        coords=coords,
        attrs={
            "description": "final private Gaussian q = N(mean, precision^-1) over the model's "
            "unconstrained parameters; eta = precision @ mean",
        },
    )


def trace_dataset(model: RecordModel, result: SEPResult) -> xr.Dataset:
    """Post-processed trace of the released global sites: q's mean and marginal standard deviation
    about once per pass, and the smallest precision eigenvalue after every step."""
    labels = _labels(model)
    moments = [
        result.family.moments(Natural(eta, precision))
        for eta, precision in zip(result.passes.eta, result.passes.precision, strict=True)
    ]
    mean = np.stack([m for m, _ in moments])
    spread = np.stack([s if s.ndim == 1 else np.diag(s) for _, s in moments])
    chunks = mean.shape[0]
    return xr.Dataset(
        {
            "mean": (("chunk", "param"), mean),
            "std": (("chunk", "param"), np.sqrt(spread)),
            "precision_min_eigenvalue": (("step",), result.min_eigenvalue),
        },
        coords={
            "chunk": np.minimum(
                np.arange(1, chunks + 1) * result.steps_per_chunk, result.min_eigenvalue.shape[0]
            ),
            "param": labels,
            "step": np.arange(1, result.min_eigenvalue.shape[0] + 1),
        },
        attrs={
            "description": "q's mean and marginal std over the unconstrained parameters after "
            "every chunk of steps (coordinate: steps done), and the smallest eigenvalue of its "
            "precision after every step; all functions of the DP release",
        },
    )
