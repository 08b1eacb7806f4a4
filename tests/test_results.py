"""A result's privacy metadata: one typed reader of the ``dp_*`` attributes, which round-trips
through the attributes and a netCDF file and refuses objects dpppl did not write."""

from __future__ import annotations

import math

import numpy as np
import pytest
import xarray as xr

from dpppl.privacy.events import NeighbourRelation, poisson_subsampled_gaussian
from dpppl.results import PrivacyMetadata, privacy_statement

METADATA = PrivacyMetadata(
    mechanism="na-dpvi",
    guarantee="(epsilon, delta)-DP",
    epsilon=0.9987,
    delta=1e-5,
    neighbour_relation=NeighbourRelation.ADD_OR_REMOVE_ONE,
    accountant="pld",
    event=poisson_subsampled_gaussian(1.3, 0.01, 1000, NeighbourRelation.ADD_OR_REMOVE_ONE),
    n_records=1234,
    seeded=True,
    noise_multiplier=1.3,
    privacy_details={"batch_capacity": 40},
    mechanism_settings={"steps": 1000},
    mechanism_attrs={"clipping_bound": 3.5},
    plugins={"na-dpvi": "dpppl-na-dpvi 0.1.0"},
    created_at="2026-11-25T00:00:00+00:00",
)


def test_the_attributes_read_back_as_the_metadata_they_were_written_from():
    assert PrivacyMetadata.from_attrs(METADATA.to_attrs()) == METADATA


def test_the_metadata_survives_a_netcdf_file(tmp_path):
    tree = xr.DataTree(xr.Dataset({"x": ("draw", np.zeros(3))}))
    tree.attrs = METADATA.to_attrs()
    tree.to_netcdf(tmp_path / "result.nc")
    with xr.open_datatree(tmp_path / "result.nc") as stored:
        assert PrivacyMetadata.from_result(stored) == METADATA


def test_the_attributes_hold_only_netcdf_types():
    assert all(isinstance(v, str | int | float) for v in METADATA.to_attrs().values())


def test_an_object_without_dpppl_metadata_is_refused_with_a_hint():
    with pytest.raises(ValueError, match="no dpppl privacy metadata.*dpppl.sample"):
        PrivacyMetadata.from_result(xr.DataTree())


def test_the_statement_reads_the_guarantee_from_the_metadata():
    tree = xr.DataTree()
    tree.attrs = METADATA.to_attrs()
    statement = privacy_statement(tree)
    assert "epsilon = 0.9987 and delta = 1e-05" in statement
    assert "add-or-remove-one neighbouring data sets of 1234 records" in statement
    assert "noise multiplier 1.3" in statement and "seed" in statement


def test_a_mechanism_without_a_finite_delta_says_so():
    tree = xr.DataTree()
    tree.attrs = PrivacyMetadata(**{**vars(METADATA), "delta": math.nan}).to_attrs()
    assert "(no finite-sample delta)" in privacy_statement(tree)
