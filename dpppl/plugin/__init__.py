"""The plugin contract, and everything a plugin author needs, in one place.

A mechanism or accountant plugin imports only ``dpppl`` and this module::

    import dpppl
    from dpppl.plugin import Mechanism, PrivacyPlan, Release, RecordModel, hookimpl

Modules of the contract
-----------------------
hookspecs
    The hooks a plugin implements (``register_mechanisms``, ``register_accountants``).
mechanism
    :class:`Mechanism`, :class:`PrivacyPlan` and :class:`Release`.
accountant
    :class:`Accountant`.
options
    How a mechanism declares its options (:class:`Interval`, ``POSITIVE``, ``NON_NEGATIVE``).
registry
    The plugin manager that loads plugins from the ``dpppl`` entry-point group;
    :func:`get_mechanism` and :func:`get_accountant` return the class installed under a name.

The names below also re-export the pieces of the lower layers a mechanism is built from: the
record model (:mod:`dpppl.model`), the privacy primitives and events (:mod:`dpppl.privacy`) and
progress reporting.  They are imported on first use (:mod:`dpppl.lazy`), so loading the
registry does not load PyMC or JAX.
"""

from dpppl.errors import (
    DPPPLError,
    InexactReleaseError,
    InvalidDataError,
    InvalidOptionError,
    InvalidPrivacyParameterError,
    ModelNotSupportedError,
    PluginError,
    UnsupportedEventError,
)
from dpppl.lazy import lazy_exports

__getattr__, __dir__, _lazy = lazy_exports(
    __name__,
    {
        "dpppl.model.record_model": ["RecordModel", "per_example_grad", "softplus_inverse"],
        "dpppl.model.simulation": ["PriorSummary", "prior_summary"],
        "dpppl.plugin.accountant": ["Accountant"],
        "dpppl.plugin.hookspecs": ["hookimpl"],
        "dpppl.plugin.mechanism": [
            "APPROXIMATE_DP",
            "Mechanism",
            "PrivacyPlan",
            "Release",
            "warn_user",
        ],
        "dpppl.plugin.options": ["NON_NEGATIVE", "POSITIVE", "Interval"],
        "dpppl.plugin.registry": ["get_accountant", "get_mechanism"],
        "dpppl.privacy.budget": ["check_epsilon_delta", "total_variation_delta"],
        "dpppl.privacy.events": [
            "ComposedEvent",
            "GaussianEvent",
            "NeighbourRelation",
            "PoissonSampledEvent",
            "PrivacyEvent",
            "SampledWithoutReplacementEvent",
            "SelfComposedEvent",
            "poisson_subsampled_gaussian",
        ],
        "dpppl.privacy.noise": [
            "SnappedGaussian",
            "clip_rows",
            "gaussian_noise",
            "jax_key",
            "require_exact",
            "snapped_gaussian_release",
            "snapped_sensitivity",
        ],
        "dpppl.privacy.noise_calibration": ["calibrate_noise_multiplier"],
        "dpppl.privacy.subsampling": [
            "GeometricTable",
            "PoissonSampler",
            "binomial_counts",
            "binomial_thresholds",
            "copies_of",
            "gather",
            "poisson_batch",
        ],
        "dpppl.progress": ["Progress", "Task"],
    },
)
__all__ = [
    "DPPPLError",
    "InexactReleaseError",
    "InvalidDataError",
    "InvalidOptionError",
    "InvalidPrivacyParameterError",
    "ModelNotSupportedError",
    "PluginError",
    "UnsupportedEventError",
    *_lazy,
]
