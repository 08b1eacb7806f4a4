"""The plugin manager: loads plugins from the ``dpppl`` entry-point group and keeps the registries.

Set ``DPPPL_LOAD_PLUGINS`` to a comma-separated list of distribution names to load only those
(an empty string loads none), like ``LLM_LOAD_PLUGINS`` in llm.

:func:`mechanisms` and :func:`accountants` describe what is installed.  Loading the plugins imports
PyMC and JAX (seconds), so a process that has not loaded them reads the description from
``plugins.json`` in the user cache folder, written the last time the same plugins were loaded: it
is keyed by every selected entry point, its distribution and version, and the size and time of
every file of the package it names, so installing, upgrading or editing a plugin rebuilds it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pluggy

from dpppl.errors import PluginError, PluginNotFoundError
from dpppl.plugin import hookspecs
from dpppl.plugin.accountant import Accountant
from dpppl.plugin.mechanism import Mechanism
from dpppl.user_cache import cache_dir

GROUP = "dpppl"


@dataclass
class Registry:
    """Mechanisms and accountants provided by the loaded plugins, by name."""

    mechanisms: dict[str, type[Mechanism]] = field(default_factory=dict)
    accountants: dict[str, type[Accountant]] = field(default_factory=dict)
    providers: dict[tuple[str, str], str] = field(default_factory=dict)


_manager: pluggy.PluginManager | None = None
_registry: Registry | None = None
#: Providers of the plugins loaded one by one under DPPPL_LOAD_PLUGINS, which pluggy does not record.
_selected_distributions: dict[str, str] = {}


def _entry_points() -> list[tuple[importlib.metadata.Distribution, importlib.metadata.EntryPoint]]:
    """The entry points of the group with their distributions, as ``DPPPL_LOAD_PLUGINS`` selects."""
    allowed = os.environ.get("DPPPL_LOAD_PLUGINS")
    names = None if allowed is None else {n.strip() for n in allowed.split(",") if n.strip()}
    return [
        (dist, ep)
        for dist in importlib.metadata.distributions()
        if names is None or dist.metadata["Name"] in names
        for ep in dist.entry_points
        if ep.group == GROUP
    ]


def _load_entry_points(manager: pluggy.PluginManager) -> None:
    if os.environ.get("DPPPL_LOAD_PLUGINS") is None:
        manager.load_setuptools_entrypoints(GROUP)
        return
    for dist, ep in _entry_points():
        if manager.get_plugin(ep.name) is None:
            plugin = ep.load()
            manager.register(plugin, name=ep.name)
            _selected_distributions[plugin.__name__.split(".")[0]] = (
                f"{dist.metadata['Name']} {dist.version}"
            )


def get_plugin_manager() -> pluggy.PluginManager:
    """The process-wide plugin manager, loading entry points on first use."""
    global _manager
    if _manager is None:
        manager = pluggy.PluginManager(GROUP)
        manager.add_hookspecs(hookspecs)
        _load_entry_points(manager)
        manager.check_pending()
        _manager = manager
    return _manager


def register_plugin(plugin: ModuleType | object, name: str | None = None) -> None:
    """Register a plugin object by hand (tests, notebooks); entry points are the normal way."""
    get_plugin_manager().register(plugin, name=name)
    reset_registry()


def unregister_plugin(name: str) -> None:
    """Remove a plugin registered with :func:`register_plugin`."""
    get_plugin_manager().unregister(name=name)
    reset_registry()


def reset_registry() -> None:
    """Forget the registries so the next lookup asks the plugins again."""
    global _registry
    _registry = None


def _distributions() -> dict[str, str]:
    """'distribution version' by top-level package, for the plugins loaded from entry points.

    Read from pluggy's record of where each plugin came from: scanning every installed
    distribution (``importlib.metadata.packages_distributions``) took seconds of every first fit.
    """
    loaded = {
        plugin.__name__.split(".")[0]: f"{dist.project_name} {dist.version}"
        for plugin, dist in get_plugin_manager().list_plugin_distinfo()
        if hasattr(plugin, "__name__")
    }
    return {**_selected_distributions, **loaded}


def _provider(obj: object, distributions: dict[str, str]) -> str:
    """'distribution version' of the plugin that holds ``obj``'s module; the module itself for a
    plugin registered by hand."""
    module = getattr(obj, "__module__", "") or ""
    return distributions.get(module.split(".")[0]) or module or repr(obj)


def registry() -> Registry:
    """The registries, built from every loaded plugin's hooks on first use."""
    global _registry
    if _registry is not None:
        return _registry
    hook = get_plugin_manager().hook
    result = Registry()
    distributions = _distributions()
    hook.register_mechanisms(
        register=_registering(result, "mechanism", Mechanism, distributions)
    )
    hook.register_accountants(
        register=_registering(result, "accountant", Accountant, distributions)
    )
    _registry = result
    return result


def _registering(
    result: Registry, kind: str, base: type, distributions: dict[str, str]
) -> Callable[[type], None]:
    table = result.mechanisms if kind == "mechanism" else result.accountants

    def register(cls: type) -> None:
        provider = _provider(cls, distributions)
        if not (isinstance(cls, type) and issubclass(cls, base)):
            raise PluginError(f"{provider} registered {cls!r}, which is not a {base.__name__} subclass")
        name = getattr(cls, "name", None)
        if not isinstance(name, str) or not name:
            raise PluginError(f"{provider} registered {cls.__name__} without a `name`")
        if name in table and table[name] is not cls:
            raise PluginError(
                f"{kind} {name!r} is registered twice: by {result.providers[(kind, name)]} and by "
                f"{provider}; uninstall one of them"
            )
        table[name] = cls
        result.providers[(kind, name)] = provider

    return register


def _lookup(table: dict, kind: str, name: str):
    if name not in table:
        installed = ", ".join(sorted(table)) or "none"
        raise PluginNotFoundError(
            f"no {kind} named {name!r} is installed; installed {kind}s: {installed}. "
            f"Install the plugin that provides it (see `dpppl plugins`)"
        )
    return table[name]


def get_mechanism(name: str) -> type[Mechanism]:
    """The mechanism class registered under ``name``."""
    return _lookup(registry().mechanisms, "mechanism", name)


def get_accountant(name: str) -> type[Accountant]:
    """The accountant class registered under ``name``."""
    return _lookup(registry().accountants, "accountant", name)


def provider(kind: str, name: str) -> str:
    """'distribution version' of the plugin that registered a mechanism or accountant."""
    return registry().providers[(kind, name)]


# -- what is installed ----------------------------------------------------------------------------


@dataclass(frozen=True)
class PluginInfo:
    """An installed mechanism or accountant, as :func:`mechanisms` and ``dpppl plugins`` list it.

    Attributes
    ----------
    kind
        ``"mechanism"`` or ``"accountant"``.
    name
        What users pass as ``mechanism=`` or ``accountant=``.
    description
        The class's one-line description.
    options
        Option name -> default, in the class's order, JSON-compatible as a result's
        ``dp_mechanism_settings`` stores them (:data:`REQUIRED` for an option without a default);
        empty for accountants, which take none.
    distribution, version
        The distribution that provides it; for a plugin registered by hand, its module and
        ``"unknown"``.
    """

    kind: str
    name: str
    description: str
    options: dict[str, Any]
    distribution: str
    version: str


#: The default shown for an option that has none.
REQUIRED = "<required>"


def mechanisms() -> dict[str, PluginInfo]:
    """The installed mechanisms by name: description, options with defaults, and provider.

    >>> dpppl.mechanisms()["na-dpvi"].options["steps"]
    10000
    """
    return _described("mechanism")


def accountants() -> dict[str, PluginInfo]:
    """The installed accountants by name: description and provider."""
    return _described("accountant")


def _described(kind: str) -> dict[str, PluginInfo]:
    return {info.name: info for info in _catalogue() if info.kind == kind}


def _catalogue() -> list[PluginInfo]:
    if _manager is not None:  # loaded here already, maybe with plugins registered by hand
        return _describe_registry()
    path = cache_dir() / "plugins.json"
    key = _installation_key()
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
        if stored["key"] == key:
            return [PluginInfo(**entry) for entry in stored["plugins"]]
    except (OSError, ValueError, KeyError, TypeError):
        pass  # no listing yet, or an unreadable one: load the plugins and write it again
    listing = _describe_registry()
    record = {"key": key, "plugins": [dataclasses.asdict(info) for info in listing]}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}")
        partial.write_text(json.dumps(record), encoding="utf-8")
        partial.replace(path)  # atomic: a concurrent reader sees the old listing or the new one
    except OSError:
        pass  # a read-only home: list without remembering
    return listing


def _describe_registry() -> list[PluginInfo]:
    installed = registry()
    listing = []
    for kind, table in (("mechanism", installed.mechanisms), ("accountant", installed.accountants)):
        for name in sorted(table):
            distribution, _, version = provider(kind, name).partition(" ")
            listing.append(
                PluginInfo(
                    kind=kind,
                    name=name,
                    description=table[name].description,
                    options=_option_defaults(table[name]) if kind == "mechanism" else {},
                    distribution=distribution,
                    version=version or "unknown",
                )
            )
    return listing


def _option_defaults(cls: type[Mechanism]) -> dict[str, Any]:
    defaults = {}
    for option in dataclasses.fields(cls.Options):
        if option.default is not dataclasses.MISSING:
            defaults[option.name] = option.default
        elif option.default_factory is not dataclasses.MISSING:
            defaults[option.name] = option.default_factory()
        else:
            defaults[option.name] = REQUIRED
    # The same normalisation as Mechanism.settings, so a cached listing equals a fresh one.
    return json.loads(json.dumps(defaults, default=str))


def _installation_key() -> str:
    """A digest of the selected entry points, their distributions and their packages' files."""
    parts: list[Any] = [os.environ.get("DPPPL_LOAD_PLUGINS")]
    for dist, ep in sorted(_entry_points(), key=lambda pair: (pair[1].name, pair[1].value)):
        parts.append([dist.metadata["Name"], dist.version, ep.name, ep.value])
        parts.append(_package_files(ep.value.split(":")[0].split(".")[0]))
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def _package_files(package: str) -> list[tuple[str, int, int]]:
    """(path, size, modification time) of every Python file of a top-level package, found without
    importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None:
        return []
    if spec.submodule_search_locations:
        files = [p for root in spec.submodule_search_locations for p in Path(root).rglob("*.py")]
    else:
        files = [Path(spec.origin)] if spec.origin else []
    stats = {str(path): path.stat() for path in files}
    return sorted((path, stat.st_size, stat.st_mtime_ns) for path, stat in stats.items())
