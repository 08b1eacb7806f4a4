"""Turning a mechanism's release into an ArviZ ``DataTree`` with its privacy metadata.

The result holds the posterior (constrained, named and dimensioned like the model), the
mechanism's own groups, and the guarantee as root attributes (``dp_*``) that survive
``to_netcdf``.  It never holds ``observed_data``, ``constant_data``, ``log_likelihood`` or any
other per-record group.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import arviz_base
import jax
import numpy as np
import xarray as xr

from dpppl.errors import PluginError
from dpppl.model.record_model import RecordModel
from dpppl.plugin.mechanism import PrivacyPlan, Release
from dpppl.privacy.events import NeighbourRelation, PrivacyEvent, event_from_json
from dpppl.version import __version__

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


@dataclass(frozen=True)
class PrivacyMetadata:
    """The guarantee a result carries and how it was obtained: its ``dp_*`` root attributes,
    typed.  :meth:`to_attrs` writes them (netCDF-safe: str, int, float); :meth:`from_result`
    reads them back, and is the one reader every consumer uses.

    The seed itself is never stored (whoever knows it can regenerate and remove the noise): only
    whether one was fixed.
    """

    mechanism: str
    guarantee: str
    epsilon: float
    delta: float
    neighbour_relation: NeighbourRelation
    accountant: str | None
    event: PrivacyEvent | None
    n_records: int
    seeded: bool
    noise_multiplier: float | None = None
    privacy_details: dict[str, Any] = field(default_factory=dict)
    mechanism_settings: dict[str, Any] = field(default_factory=dict)
    mechanism_attrs: dict[str, Any] = field(default_factory=dict)
    plugins: dict[str, str] = field(default_factory=dict)
    dpppl_version: str = __version__
    created_at: str = ""

    def to_attrs(self) -> dict[str, Any]:
        """The root attributes of a result."""
        attrs = {
            "dp_mechanism": self.mechanism,
            "dp_guarantee": self.guarantee,
            "dp_epsilon": float(self.epsilon),
            "dp_delta": float(self.delta),
            "dp_neighbour_relation": self.neighbour_relation.value,
            "dp_accountant": self.accountant or "none",
            "dp_event": self.event.to_json() if self.event is not None else "none",
            "dp_privacy_details": _json(self.privacy_details),
            "dp_mechanism_settings": _json(self.mechanism_settings),
            "dp_mechanism_attrs": _json(self.mechanism_attrs),
            "dp_n_records": int(self.n_records),
            "dp_seeded": int(self.seeded),
            "dp_plugins": _json(self.plugins),
            "dpppl_version": self.dpppl_version,
            "inference_library": "dpppl",
            "created_at": self.created_at,
        }
        if self.noise_multiplier is not None:
            attrs["dp_noise_multiplier"] = float(self.noise_multiplier)
        return attrs

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any]) -> PrivacyMetadata:
        """Read the ``dp_*`` attributes (as :meth:`to_attrs` wrote them, or from a netCDF file).

        Raises
        ------
        ValueError
            If ``attrs`` carry no dpppl privacy metadata.
        """
        if "dp_epsilon" not in attrs or "dp_mechanism" not in attrs:
            raise ValueError(
                "this object carries no dpppl privacy metadata (dp_* attributes): "
                "pass a result of dpppl.sample, or a file written from one"
            )
        accountant = str(attrs.get("dp_accountant", "none"))
        event = str(attrs.get("dp_event", "none"))
        noise = attrs.get("dp_noise_multiplier")
        return cls(
            mechanism=str(attrs["dp_mechanism"]),
            guarantee=str(attrs["dp_guarantee"]),
            epsilon=float(attrs["dp_epsilon"]),
            delta=float(attrs["dp_delta"]),
            neighbour_relation=NeighbourRelation(attrs["dp_neighbour_relation"]),
            accountant=None if accountant == "none" else accountant,
            event=None if event == "none" else event_from_json(event),
            n_records=int(attrs["dp_n_records"]),
            seeded=bool(int(attrs.get("dp_seeded", 0))),
            noise_multiplier=None if noise is None else float(noise),
            privacy_details=json.loads(attrs.get("dp_privacy_details", "{}")),
            mechanism_settings=json.loads(attrs.get("dp_mechanism_settings", "{}")),
            mechanism_attrs=json.loads(attrs.get("dp_mechanism_attrs", "{}")),
            plugins=json.loads(attrs.get("dp_plugins", "{}")),
            dpppl_version=str(attrs.get("dpppl_version", "")),
            created_at=str(attrs.get("created_at", "")),
        )

    @classmethod
    def from_result(cls, result: xr.DataTree) -> PrivacyMetadata:
        """The metadata of a result (see :meth:`from_attrs`)."""
        return cls.from_attrs(result.attrs)


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
    """The ``dp_*`` root attributes: the guarantee and how it was obtained (public metadata).

    The mechanism's :attr:`Release.privacy` corrects the plan's numbers (for example a final ε).
    """
    privacy = {
        "epsilon": plan.epsilon,
        "delta": plan.delta,
        "guarantee": plan.guarantee,
        "accountant": plan.accountant,
        "noise_multiplier": plan.noise_multiplier,
        "details": plan.details,
    }
    privacy.update(release.privacy)
    return PrivacyMetadata(
        mechanism=mechanism,
        guarantee=privacy["guarantee"],
        epsilon=float(privacy["epsilon"]),
        delta=float(privacy["delta"]),
        neighbour_relation=plan.relation,
        accountant=privacy["accountant"],
        event=plan.event,
        n_records=int(n_records),
        seeded=bool(seeded),
        noise_multiplier=privacy["noise_multiplier"],
        privacy_details=privacy["details"],
        mechanism_settings=settings,
        mechanism_attrs=release.attrs,
        plugins=providers,
        created_at=datetime.now(UTC).isoformat(),
    ).to_attrs()


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
    meta = PrivacyMetadata.from_result(result)
    relation = meta.neighbour_relation.value.replace("_", "-")
    delta_text = (
        f" and delta = {meta.delta:.3g}"
        if math.isfinite(meta.delta)
        else " (no finite-sample delta)"
    )
    noise = f"; noise multiplier {meta.noise_multiplier:.4g}." if meta.noise_multiplier is not None else "."
    lines = [
        f"{meta.guarantee} with epsilon = {meta.epsilon:.4g}{delta_text}, "
        f"for {relation} neighbouring data sets of {meta.n_records} records.",
        f"Mechanism: {meta.mechanism}; accountant: {meta.accountant or 'none'}{noise}",
    ]
    if meta.seeded:
        lines.append(
            "A fixed random seed was used: the result is private only while that seed is secret."
        )
    return "\n".join(lines)
