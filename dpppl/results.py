"""Turning a mechanism's release into an ArviZ ``DataTree`` with its privacy metadata.

The result holds the posterior (constrained, named and dimensioned like the model), the
mechanism's own groups, and the guarantee as root attributes (``dp_*``) that survive
``to_netcdf``.  It never holds ``observed_data``, ``constant_data``, ``log_likelihood`` or any
other per-record group.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Any

import arviz_base
import jax
import numpy as np
import xarray as xr

from dpppl import __version__
from dpppl.errors import PluginError
from dpppl.mechanism import PrivacyPlan, Release
from dpppl.record_model import RecordModel

#: Groups a result may never contain: each holds data or per-record quantities.
FORBIDDEN_GROUPS = frozenset(
    {
        "observed_data",
        "constant_data",
        "log_likelihood",
        "log_prior",
        "posterior_predictive",
        "predictions",
        "predictions_constant_data",
    }
)


def constrained_draws(model: RecordModel, draws: np.ndarray) -> dict[str, np.ndarray]:
    """Map unconstrained draws (chain, draw, n) to the model's named, constrained variables."""
    draws = np.asarray(draws, dtype=float)
    if draws.ndim != 3 or draws.shape[-1] != model.n_params:
        raise PluginError(
            f"a mechanism must release draws of shape (chain, draw, {model.n_params}), "
            f"got {draws.shape}"
        )
    constrain = model.cached("constrain_draws", lambda: jax.jit(jax.vmap(model.constrain)))
    flat = constrain(draws.reshape(-1, model.n_params))
    chains, n_draws = draws.shape[:2]
    return {
        name: np.asarray(value).reshape(chains, n_draws, *np.shape(value)[1:])
        for name, value in flat.items()
    }


def posterior_tree(model: RecordModel, draws: np.ndarray) -> xr.DataTree:
    """A ``DataTree`` whose ``posterior`` holds unconstrained draws (chain, draw, n) as the
    model's named, constrained, dimensioned variables."""
    pm_model = model.model
    values = constrained_draws(model, draws)
    dims = {
        name: list(pm_model.named_vars_to_dims[name])
        for name in values
        if pm_model.named_vars_to_dims.get(name)
    }
    used = {d for ds in dims.values() for d in ds}
    coords = {d: list(pm_model.coords[d]) for d in used if pm_model.coords.get(d) is not None}
    return arviz_base.from_dict({"posterior": values}, dims=dims, coords=coords)


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def privacy_attrs(
    plan: PrivacyPlan,
    release: Release,
    *,
    mechanism: str,
    settings: dict[str, Any],
    n_records: int,
    seeded: bool,
    providers: dict[str, str],
) -> dict[str, Any]:
    """The ``dp_*`` root attributes: the guarantee and how it was obtained (public metadata)."""
    privacy = {
        "epsilon": plan.epsilon,
        "delta": plan.delta,
        "guarantee": plan.guarantee,
        "accountant": plan.accountant,
        "noise_multiplier": plan.noise_multiplier,
        "details": plan.details,
    }
    privacy.update(release.privacy)
    attrs = {
        "dp_mechanism": mechanism,
        "dp_guarantee": privacy["guarantee"],
        "dp_epsilon": float(privacy["epsilon"]),
        "dp_delta": float(privacy["delta"]),
        "dp_neighbour_relation": plan.relation.value,
        "dp_accountant": privacy["accountant"] or "none",
        "dp_event": plan.event.to_json() if plan.event is not None else "none",
        "dp_privacy_details": _json(privacy["details"]),
        "dp_mechanism_settings": _json(settings),
        "dp_mechanism_attrs": _json(release.attrs),
        "dp_n_records": int(n_records),
        # The seed itself is never stored: whoever knows it can regenerate and remove the noise.
        "dp_seeded": int(seeded),
        "dp_plugins": _json(providers),
        "dpppl_version": __version__,
        "inference_library": "dpppl",
        "created_at": datetime.now(UTC).isoformat(),
    }
    if privacy["noise_multiplier"] is not None:
        attrs["dp_noise_multiplier"] = float(privacy["noise_multiplier"])
    return attrs


def build_result(model: RecordModel, release: Release, attrs: dict[str, Any]) -> xr.DataTree:
    """Assemble the ``DataTree``: posterior, the mechanism's groups, privacy attributes."""
    forbidden = FORBIDDEN_GROUPS & set(release.groups)
    if forbidden:
        raise PluginError(
            f"the mechanism tried to release group(s) {sorted(forbidden)}, which hold private "
            "data; a mechanism may release only what its guarantee covers"
        )
    tree = posterior_tree(model, release.draws)
    for name, dataset in release.groups.items():
        if name == "posterior":
            raise PluginError("a mechanism's extra groups cannot be named 'posterior'")
        tree[name] = xr.DataTree(dataset)
    tree.attrs = attrs
    tree["posterior"].attrs.update(
        {
            "inference_library": "dpppl",
            "inference_library_version": attrs["dpppl_version"],
            "dp_mechanism": attrs["dp_mechanism"],
        }
    )
    return tree


def privacy_statement(result: xr.DataTree) -> str:
    """A sentence stating the guarantee a result carries, read from its attributes."""
    attrs = result.attrs
    if "dp_epsilon" not in attrs:
        raise ValueError("this object carries no dpppl privacy metadata")
    relation = attrs["dp_neighbour_relation"].replace("_", "-")
    epsilon, delta = float(attrs["dp_epsilon"]), float(attrs["dp_delta"])
    delta_text = f" and delta = {delta:.3g}" if math.isfinite(delta) else " (no finite-sample delta)"
    lines = [
        f"{attrs['dp_guarantee']} with epsilon = {epsilon:.4g}{delta_text}, "
        f"for {relation} neighbouring data sets of {int(attrs['dp_n_records'])} records.",
        f"Mechanism: {attrs['dp_mechanism']}; accountant: {attrs['dp_accountant']}"
        + (
            f"; noise multiplier {float(attrs['dp_noise_multiplier']):.4g}."
            if "dp_noise_multiplier" in attrs
            else "."
        ),
    ]
    if int(attrs.get("dp_seeded", 0)):
        lines.append(
            "A fixed random seed was used: the result is private only while that seed is secret."
        )
    return "\n".join(lines)
