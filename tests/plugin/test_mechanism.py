"""``dpppl.plugin.warn_user``: a plugin's warning names the user's line, as PyMC's do."""

from __future__ import annotations

import importlib
import sys
import warnings

import pytest

PLUGIN = """
from dpppl.plugin import warn_user


def check_model():
    warn_user("this model is written non-centred")


def fit():
    # A plugin warns several frames below its entry point.
    check_model()
"""

USER = """
import dpppl_third_party


def main():
    dpppl_third_party.fit()
"""


@pytest.fixture
def user_and_plugin(tmp_path, monkeypatch):
    """A third-party plugin and a user's script that calls it, importable from ``tmp_path``;
    ``make(package=False)`` writes the plugin as one module instead of a package."""
    names = ["user_script", "dpppl_third_party"]

    def make(package: bool = True):
        if package:
            (tmp_path / "dpppl_third_party").mkdir()
            (tmp_path / "dpppl_third_party" / "__init__.py").write_text(PLUGIN)
        else:
            (tmp_path / "dpppl_third_party.py").write_text(PLUGIN)
        (tmp_path / "user_script.py").write_text(USER)
        monkeypatch.syspath_prepend(str(tmp_path))
        importlib.invalidate_caches()
        return importlib.import_module("user_script")

    yield make
    for name in names:
        sys.modules.pop(name, None)


def run(script) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        script.main()
    return caught


def test_a_plugins_warning_points_at_the_users_line(user_and_plugin):
    script = user_and_plugin()
    (warning,) = run(script)
    assert str(warning.message) == "this model is written non-centred"
    assert warning.category is UserWarning
    assert warning.filename == script.__file__
    # The line of `dpppl_third_party.fit()` in main(), not a line of the plugin.
    assert warning.lineno == USER.splitlines().index("    dpppl_third_party.fit()") + 1


def test_a_plugin_written_as_one_module_is_skipped_too(user_and_plugin):
    script = user_and_plugin(package=False)
    (warning,) = run(script)
    assert warning.filename == script.__file__


def test_the_warning_is_filtered_like_any_other(user_and_plugin):
    script = user_and_plugin()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("ignore")
        script.main()
    assert caught == []
    with pytest.warns(UserWarning, match="non-centred"):
        script.main()
