"""dpppl-swag-ppm: the SWAG pseudo posterior mechanism as a dpppl plugin.

``dpppl.sample(mechanism="swag-ppm", epsilon=..., delta=...)`` once installed; see the README for
what its guarantee is and is not.
"""

from dpppl_swag_ppm.errors import CalibrationError, SwagPPMError, TrainingDivergedError
from dpppl_swag_ppm.mechanism import GUARANTEE, SwagPPM
from dpppl_swag_ppm.swag import (
    LowRankGaussian,
    SwagState,
    swag_collect,
    swag_gaussian,
    swag_init,
    swag_variance,
)

__all__ = [
    "GUARANTEE",
    "CalibrationError",
    "LowRankGaussian",
    "SwagPPM",
    "SwagPPMError",
    "SwagState",
    "TrainingDivergedError",
    "swag_collect",
    "swag_gaussian",
    "swag_init",
    "swag_variance",
]
