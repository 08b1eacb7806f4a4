"""The data-set loaders: where they look, what they return, how they fail, how they download."""

from __future__ import annotations

import importlib.resources

import numpy as np
import pandas as pd
import pytest

from dpppl import datasets
from dpppl.datasets import (
    ADULT_COLUMNS,
    AdultEncoding,
    DatasetDownloadError,
    DatasetNotFoundError,
    download_uci_adult,
    download_uci_regression,
    load_adult_sample,
    load_uci_adult,
    load_uci_regression,
    preprocess_adult,
)
from dpppl.errors import DPPPLError, InvalidDataError
from dpppl.user_cache import cache_dir

SHARED = datasets.checkout_data_dir()
needs_shared_data = pytest.mark.skipif(
    SHARED is None,
    reason="the real data sets live in ../shared/data beside the checkout, absent here",
)

# Three rows as UCI serves adult.data: no header, ", " separators, "?" for missing values.
UCI_ROWS = [
    (
        "39, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical, Not-in-family, "
        "White, Male, 2174, 0, 40, United-States, <=50K"
    ),
    (
        "50, Self-emp-not-inc, 83311, Bachelors, 13, Married-civ-spouse, Exec-managerial, "
        "Husband, White, Male, 0, 0, 13, ?, >50K"
    ),
    (
        "38, ?, 215646, HS-grad, 9, Divorced, ?, Not-in-family, White, Female, 0, 0, 40, "
        "United-States, <=50K"
    ),
]


@pytest.fixture(autouse=True)
def no_data_env(monkeypatch, tmp_path):
    """Each test starts with no DPPPL_DATA and an empty user cache of its own."""
    monkeypatch.delenv(datasets.DATA_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.fixture
def uci_mirror(tmp_path) -> str:
    """A file:// URL serving both Adult files in UCI's own format."""
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / "adult.data").write_text("\n".join(UCI_ROWS) + "\n\n")
    test_rows = [row.replace("50K", "50K.") for row in UCI_ROWS]
    (mirror / "adult.test").write_text("|1x3 Cross validator\n" + "\n".join(test_rows) + "\n")
    return mirror.as_uri() + "/"


# -- where the data are --------------------------------------------------------------------------


def test_an_explicit_folder_is_the_only_place_searched(tmp_path, monkeypatch):
    monkeypatch.setenv(datasets.DATA_ENV, str(tmp_path / "env"))
    assert datasets.data_dirs(tmp_path / "given") == [tmp_path / "given"]


def test_the_environment_variable_comes_next(tmp_path, monkeypatch):
    monkeypatch.setenv(datasets.DATA_ENV, str(tmp_path / "env"))
    assert datasets.data_dirs() == [tmp_path / "env"]
    assert datasets.download_dir() == tmp_path / "env"


def test_by_default_the_user_cache_then_the_checkout_folder(tmp_path):
    expected = [tmp_path / "cache" / "dpppl"] + ([SHARED] if SHARED else [])
    assert datasets.data_dirs() == expected
    assert datasets.download_dir() == tmp_path / "cache" / "dpppl"


def test_without_xdg_cache_home_the_cache_is_under_home(monkeypatch, tmp_path):
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_dir() == tmp_path / ".cache" / "dpppl"


def test_a_missing_file_says_where_it_looked_and_how_to_provide_it(tmp_path):
    with pytest.raises(DatasetNotFoundError) as caught:
        load_uci_adult("train", tmp_path)
    message = str(caught.value)
    assert str(tmp_path / "uci-adult" / "adult.data") in message
    assert "download=True" in message and datasets.DATA_ENV in message
    assert isinstance(caught.value, DPPPLError) and isinstance(caught.value, FileNotFoundError)


def test_a_missing_regression_set_is_an_error_too(tmp_path):
    with pytest.raises(DatasetNotFoundError, match="uci-regression/kin8nm/data.txt"):
        load_uci_regression("kin8nm", tmp_path)


def test_unknown_names_are_refused():
    with pytest.raises(ValueError, match="split must be"):
        load_uci_adult("validation")
    with pytest.raises(ValueError, match="unknown UCI regression set 'year'"):
        load_uci_regression("year")


# -- downloads ------------------------------------------------------------------------------------


def test_download_fetches_uci_files_and_reads_their_format(tmp_path, uci_mirror):
    folder = download_uci_adult(tmp_path / "data", base_url=uci_mirror)
    assert sorted(p.name for p in folder.iterdir()) == ["adult.data", "adult.test"]
    train = load_uci_adult("train", tmp_path / "data")
    test = load_uci_adult("test", tmp_path / "data")
    assert list(train.columns) == list(ADULT_COLUMNS)
    assert len(train) == len(test) == 3
    assert train["age"].tolist() == [39, 50, 38]
    assert train["workclass"].isna().tolist() == [False, False, True]
    assert train["native-country"].isna().tolist() == [False, True, False]
    assert test["class"].tolist() == ["<=50K.", ">50K.", "<=50K."]


def test_a_header_line_and_uci_format_read_alike(tmp_path, uci_mirror):
    download_uci_adult(tmp_path, base_url=uci_mirror)
    uci = load_uci_adult("train", tmp_path)
    with_header = tmp_path / "with_header.csv"
    with_header.write_text(
        ",".join(ADULT_COLUMNS) + "\n" + "\n".join(r.replace(", ", ",") for r in UCI_ROWS) + "\n"
    )
    pd.testing.assert_frame_equal(datasets.read_adult_csv(with_header), uci)


def test_load_with_download_fetches_a_missing_file_into_the_user_cache(
    monkeypatch, tmp_path, uci_mirror
):
    monkeypatch.setattr(datasets.adult, "UCI_ADULT_URL", uci_mirror)
    monkeypatch.setattr(datasets.files, "checkout_data_dir", lambda: None)
    frame = load_uci_adult("test", download=True)
    assert len(frame) == 3
    assert (tmp_path / "cache" / "dpppl" / "uci-adult" / "adult.test").is_file()


def test_a_failed_download_explains_itself_and_leaves_no_partial_file(tmp_path):
    with pytest.raises(DatasetDownloadError) as caught:
        download_uci_adult(tmp_path, base_url=(tmp_path / "nowhere").as_uri())
    message = str(caught.value)
    assert "could not download" in message and "no network access" in message
    assert str(tmp_path / "uci-adult" / "adult.data") in message
    assert not any((tmp_path / "uci-adult").iterdir())


def test_an_unreachable_server_is_a_download_error(tmp_path):
    # Port 9 (discard) on this machine refuses the connection at once.
    with pytest.raises(DatasetDownloadError, match="could not download http://127.0.0.1:9/"):
        download_uci_adult(tmp_path, base_url="http://127.0.0.1:9/")


def test_regression_download_takes_data_indices_settings_and_splits(tmp_path):
    source = tmp_path / "mirror" / "toy" / "data"
    source.mkdir(parents=True)
    np.savetxt(source / "data.txt", np.arange(30.0).reshape(10, 3))
    files = {"index_features.txt": "0\n1\n", "index_target.txt": "2\n", "n_splits.txt": "2\n"}
    files |= {"n_hidden.txt": "50\n", "n_epochs.txt": "40\n"}
    files |= {f"index_train_{i}.txt": "0\n1\n2\n3\n4\n5\n6\n7\n" for i in range(2)}
    files |= {f"index_test_{i}.txt": f"{8 + i}\n" for i in range(2)}
    for name, text in files.items():
        (source / name).write_text(text)
    datasets_sets = (*datasets.UCI_REGRESSION_SETS, "toy")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(datasets.uci_regression, "UCI_REGRESSION_SETS", datasets_sets)
        folder = download_uci_regression(
            "toy", tmp_path / "data", base_url=(tmp_path / "mirror").as_uri()
        )
        toy = load_uci_regression("toy", tmp_path / "data")
    assert folder == tmp_path / "data" / "uci-regression" / "toy"
    assert toy.X.shape == (10, 2) and toy.y.tolist() == list(np.arange(2.0, 30.0, 3))
    assert (toy.n_splits, toy.n_hidden, toy.n_epochs) == (2, 50, 40)
    train, test = toy.split(1)
    assert train.tolist() == list(range(8)) and test.tolist() == [9]


def test_an_incomplete_regression_folder_names_the_missing_files(tmp_path, monkeypatch):
    folder = tmp_path / "uci-regression" / "yacht"
    folder.mkdir(parents=True)
    np.savetxt(folder / "data.txt", np.ones((4, 7)))
    with pytest.raises(DatasetNotFoundError, match="index_features.txt"):
        load_uci_regression("yacht", tmp_path)


# -- the bundled sample --------------------------------------------------------------------------


def test_the_sample_ships_inside_the_package_with_its_licence():
    folder = importlib.resources.files("dpppl") / "data"
    assert (folder / "adult_sample.csv").is_file()
    with importlib.resources.as_file(folder / "adult_sample.csv") as path:
        assert path.stat().st_size < 1_000_000
    notice = (folder / "README.md").read_text()
    assert "CC BY 4.0" in notice and "Becker" in notice and "Kohavi" in notice


def test_the_sample_is_2000_adult_rows_with_missing_values_marked():
    sample = load_adult_sample()
    assert sample.shape == (2000, len(ADULT_COLUMNS))
    assert list(sample.columns) == list(ADULT_COLUMNS)
    assert sample["age"].between(17, 90).all()
    assert set(sample["class"]) == {"<=50K", ">50K"}
    assert sample.isna().any(axis=1).sum() == 163  # the README's count of rows with a "?"
    assert not (sample == "?").any().any()


# -- preprocessing --------------------------------------------------------------------------------


def adult_frame(rows: list[dict]) -> pd.DataFrame:
    """Adult rows with defaults for every column the test does not care about."""
    base = {
        "age": 30, "workclass": "Private", "fnlwgt": 100000, "education": "HS-grad",
        "education-num": 9, "marital-status": "Never-married", "occupation": "Sales",
        "relationship": "Unmarried", "race": "White", "sex": "Female", "capital-gain": 0,
        "capital-loss": 0, "hours-per-week": 40, "native-country": "Peru", "class": "<=50K",
    }  # fmt: skip
    return pd.DataFrame([{**base, **row} for row in rows], columns=list(ADULT_COLUMNS))


def test_preprocessing_follows_the_na_dpvi_paper():
    frame = adult_frame(
        [
            {"age": 20, "class": ">50K", "sex": "Male"},
            {"age": 60, "class": "<=50K.", "native-country": np.nan},
            {"age": 40, "class": ">50K.", "workclass": "State-gov"},
            {"age": 50, "occupation": np.nan},
        ]
    )
    X, y = preprocess_adult(frame)
    assert not {"education-num", "native-country", "relationship"} & {c.split("=")[0] for c in X}
    # The row missing its occupation goes; the one missing only native-country (dropped) stays.
    assert list(X.index) == [0, 1, 2]
    assert y.tolist() == [1, 0, 1]
    assert X["age"].tolist() == [0.0, 1.0, 0.5]
    assert X["sex=Male"].tolist() == [1.0, 0.0, 0.0]
    assert X["workclass=State-gov"].tolist() == [0.0, 0.0, 1.0]
    assert X.filter(like="workclass=").sum(axis=1).tolist() == [1.0, 1.0, 1.0]
    assert X["capital-gain"].tolist() == [0.0, 0.0, 0.0]  # a constant column maps to 0


def test_an_encoding_fitted_on_train_carries_over_to_test():
    train = adult_frame([{"age": 20}, {"age": 60, "race": "Black"}])
    test = adult_frame([{"age": 80, "race": "Other"}, {"age": 10}])
    encoding = AdultEncoding.fit(train)
    X_test, _ = encoding.transform(test)
    assert list(X_test.columns) == encoding.feature_names
    assert X_test["age"].tolist() == [1.0, 0.0]  # clipped to the training range
    assert X_test.filter(like="race=").sum(axis=1).tolist() == [0.0, 1.0]  # unseen: all zero


def test_an_encoding_built_from_public_bounds_uses_only_its_columns():
    encoding = AdultEncoding(categories={"sex": ("Female", "Male")}, bounds={"age": (0.0, 100.0)})
    X, y = encoding.transform(adult_frame([{"age": 25, "sex": "Male", "occupation": np.nan}]))
    assert list(X.columns) == ["age", "sex=Female", "sex=Male"]
    assert X.iloc[0].tolist() == [0.25, 0.0, 1.0] and y.tolist() == [0]


def test_an_unknown_label_is_refused_without_quoting_it():
    frame = adult_frame([{"class": "rich-person-42"}])
    with pytest.raises(InvalidDataError) as caught:
        preprocess_adult(frame)
    assert "rich-person-42" not in str(caught.value)


# -- the real files (../shared/data) --------------------------------------------------------------


@needs_shared_data
def test_the_real_adult_splits_load_and_preprocess():
    train, test = load_uci_adult("train"), load_uci_adult("test")
    assert train.shape == (32561, 15) and test.shape == (16281, 15)
    encoding = AdultEncoding.fit(train)
    X_train, y_train = encoding.transform(train)
    X_test, y_test = encoding.transform(test)
    assert X_train.shape == (30718, 56) and list(X_test.columns) == list(X_train.columns)
    assert len(X_test) == 15315
    assert X_train.to_numpy().min() == 0.0 and X_train.to_numpy().max() == 1.0
    assert 0.24 < y_train.mean() < 0.26 and 0.23 < y_test.mean() < 0.26


@needs_shared_data
@pytest.mark.parametrize(
    ("name", "shape", "n_splits"),
    [
        ("kin8nm", (8192, 9), 20),
        ("protein-tertiary-structure", (45730, 10), 5),
        ("yacht", (308, 7), 20),
    ],
)
def test_the_real_regression_sets_load_with_their_settings(name, shape, n_splits):
    data = load_uci_regression(name)
    assert data.data.shape == shape and data.n_splits == n_splits
    assert data.X.shape == (shape[0], shape[1] - 1) and data.y.shape == (shape[0],)
    train, test = data.split(0)
    assert len(np.intersect1d(train, test)) == 0 and len(train) + len(test) == shape[0]
    assert len(test) == round(0.1 * shape[0])
    again, _ = data.split(0)
    other, _ = data.split(1)
    assert np.array_equal(train, again) and not np.array_equal(train, other)


@needs_shared_data
def test_every_benchmark_set_is_there():
    for name in datasets.UCI_REGRESSION_SETS:
        assert load_uci_regression(name).n_splits >= 1, name
