"""Names a package re-exports from modules imported on first use (PEP 562, as SPEC 1's
``lazy_loader`` does for the packages of one tree, here across the layers of dpppl).

``import dpppl`` and ``import dpppl.plugin`` then load neither PyMC, PyTensor, JAX nor ArviZ, so
``dpppl --help`` and the plugin registry answer at once.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, Sequence[str]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """``__getattr__``, ``__dir__`` and ``__all__`` for ``package``.

    Parameters
    ----------
    package
        The importing package's ``__name__``; a resolved name is cached in its namespace.
    exports
        Absolute module name → the names it defines that the package re-exports.
    """
    module_of = {name: module for module, names in exports.items() for name in names}
    eager = sys.modules[package]

    def __getattr__(name: str) -> Any:
        module = module_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(eager, name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(eager)) | set(module_of))

    return __getattr__, __dir__, sorted(module_of)
