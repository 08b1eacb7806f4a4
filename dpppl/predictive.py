"""``dpppl.sample_posterior_predictive``: PyMC's posterior predictive sampling, minus the data.

``pm.sample_posterior_predictive`` works on a dpppl result, but it also returns the model's
``observed_data`` and ``constant_data``: the private data set, ready to be saved beside a private
posterior.  This wrapper returns only the draws, and refuses draws that are per-record functions
of private data:

* draws at the records' own covariates (a ``pm.Data`` along the record dimension) are one
  noisy function of each record's covariates: they are refused unless ``predictions=True``
  says the covariates now in the model are new, public ones (set with ``pm.set_data``), or
  ``use_private_covariates=True`` asks for a check that stays with the data holder (marked
  NOT PRIVATE);
* posterior predictive draws that read no covariate (the observed variables of a model without
  covariates) depend on the private posterior and the public N only; the labels of the record
  dimension, which may come from the data (a DataFrame index), are replaced by positions.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pymc as pm
import xarray as xr
from pymc.sampling.forward import observed_dependent_deterministics
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.traversal import ancestors

from dpppl.errors import PrivateDataError
from dpppl.model.record_structure import find_records, pymc_model

#: The groups of PyMC's answer that hold draws; the others hold data.
DRAW_GROUPS = ("posterior_predictive", "predictions")

#: ``privacy_note`` of draws that read the records' own covariates.
PRIVATE_COVARIATES_USED = (
    "NOT PRIVATE: drawn at the records' own covariates (use_private_covariates=True); each "
    "record's draws are a function of its private values. Keep them with the data holder."
)


def sample_posterior_predictive(
    idata: xr.DataTree,
    model: pm.Model | None = None,
    *,
    var_names: list[str] | None = None,
    predictions: bool = False,
    extend_inferencedata: bool = False,
    records: str | None = None,
    use_private_covariates: bool = False,
    **kwargs: Any,
) -> xr.DataTree | dict[str, np.ndarray]:
    """Posterior predictive draws (or predictions) of a dpppl result, without the data.

    Shaped like ``pm.sample_posterior_predictive``: inside ``with model:`` or with ``model=``,
    and every keyword PyMC takes (``random_seed``, ``sample_vars``, ``progressbar``,
    ``return_inferencedata``...) is passed on.

    Parameters
    ----------
    idata
        A result of :func:`dpppl.sample` (or one read back from netCDF).
    model
        The PyMC model (or ``bambi.Model``); taken from the ``with`` context when None.
    var_names
        The variables to draw; PyMC's default (the observed variables and the deterministics
        that depend on them) when None.
    predictions
        The model holds new, public covariates (set with ``pm.set_data``, with the coordinates
        of the new records): draw at them, into a ``predictions`` group.  This is your
        statement that they are not the private ones.
    extend_inferencedata
        Refused when True: PyMC would add the draws and the model's data to the result.  Keep the
        draws as their own tree.
    records
        Name of the record dimension, if :func:`dpppl.sample` needed it.
    use_private_covariates
        Draw at the records' own covariates, for a check that stays with the data holder: the
        draws are marked NOT PRIVATE in their ``privacy_note`` and must not be released.

    Returns
    -------
    xarray.DataTree or dict
        A tree with the ``posterior_predictive`` (or ``predictions``) group only: no
        ``observed_data``, ``constant_data`` or ``predictions_constant_data``.  With
        ``return_inferencedata=False``, PyMC's dict of draws.

    Raises
    ------
    PrivateDataError
        For ``extend_inferencedata=True``, and for draws that read the records' covariates
        without ``predictions=True`` or ``use_private_covariates=True``.
    """
    if extend_inferencedata:
        raise PrivateDataError(
            "extend_inferencedata=True would add the draws, and the model's observed and "
            "constant data, to the private result; a result holds only what its guarantee "
            "covers. Keep the draws apart: draws = dpppl.sample_posterior_predictive(idata)"
        )
    model = pymc_model(model)
    structure = find_records(model, records)
    outputs = _outputs(model, var_names, kwargs.get("sample_vars"))
    record_arrays = {v.variable: v.name for v in structure.variables}
    reads = sorted(
        {
            record_arrays[node]
            for node in ancestors(outputs, blockers=model.free_RVs)
            if node in record_arrays
        }
    )
    fixed = sorted(
        v.name
        for v in structure.variables
        if v.name in reads and not isinstance(v.variable, SharedVariable)
    )
    if fixed and predictions and not use_private_covariates:
        raise PrivateDataError(
            f"{fixed} are arrays fixed in the model (numpy arrays, or Bambi's design matrix), "
            "which pm.set_data cannot replace: they still hold the records' own values. Hold "
            "covariates in pm.Data to predict at new ones (for Bambi, use its "
            "predict(idata, data=new_public_frame, inplace=False))"
        )
    if reads and not (predictions or use_private_covariates):
        raise PrivateDataError(
            f"{sorted(v.name for v in outputs)} would be drawn at the records' own data "
            f"{reads}: the draws of each record are a function of its private values. For "
            "predictions, put public covariates into the model with pm.set_data(...) and pass "
            "predictions=True; for a check that stays with you, use_private_covariates=True "
            "(the draws are then marked not private)"
        )
    answer = pm.sample_posterior_predictive(
        idata, model=model, var_names=var_names, predictions=predictions, **kwargs
    )
    if not isinstance(answer, xr.DataTree):
        return answer
    group = "predictions" if predictions else "posterior_predictive"
    draws = answer[group].to_dataset()
    if use_private_covariates and reads:
        draws.attrs["privacy_note"] = PRIVATE_COVARIATES_USED
    elif not predictions and structure.dim in draws.dims:
        draws = draws.assign_coords({structure.dim: np.arange(draws.sizes[structure.dim])})
    tree = xr.DataTree.from_dict({group: draws})
    tree.attrs = dict(answer.attrs)
    return tree


def _outputs(
    model: pm.Model, var_names: list[str] | None, sample_vars: list[str] | str | None
) -> list:
    """The variables PyMC will draw, chosen as it chooses them."""
    if isinstance(sample_vars, str):
        sample_vars = [sample_vars]
    names = var_names or sample_vars
    if names is not None:
        return [model[name] for name in ([names] if isinstance(names, str) else names)]
    return [*model.observed_RVs, *observed_dependent_deterministics(model)]
