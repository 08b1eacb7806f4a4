"""Where dpppl keeps files between processes: the user cache folder.

Data sets it downloads, the compiled XLA programs of model structures and the Python source PyTensor
generates for them live under ``$XDG_CACHE_HOME/dpppl`` (``~/.cache/dpppl`` by default).  Nothing
private is ever written here.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """The user cache folder: ``$XDG_CACHE_HOME/dpppl``, else ``~/.cache/dpppl``."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "dpppl"
