"""The plugin manager: loads plugins from the ``dpppl`` entry-point group and keeps the registries.

Set ``DPPPL_LOAD_PLUGINS`` to a comma-separated list of distribution names to load only those
(an empty string loads none), like ``LLM_LOAD_PLUGINS`` in llm.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType

import pluggy

from dpppl import hookspecs
from dpppl.accounting import Accountant
from dpppl.errors import PluginError, PluginNotFoundError
from dpppl.mechanism import Mechanism

GROUP = "dpppl"


@dataclass
class Registry:
    """Mechanisms, accountants and diagnostics provided by the loaded plugins, by name."""

    mechanisms: dict[str, type[Mechanism]] = field(default_factory=dict)
    accountants: dict[str, type[Accountant]] = field(default_factory=dict)
    diagnostics: dict[str, Callable] = field(default_factory=dict)
    providers: dict[tuple[str, str], str] = field(default_factory=dict)


_manager: pluggy.PluginManager | None = None
_registry: Registry | None = None
#: Providers of the plugins loaded one by one under DPPPL_LOAD_PLUGINS, which pluggy does not record.
_selected_distributions: dict[str, str] = {}


def _load_entry_points(manager: pluggy.PluginManager) -> None:
    allowed = os.environ.get("DPPPL_LOAD_PLUGINS")
    if allowed is None:
        manager.load_setuptools_entrypoints(GROUP)
        return
    names = {n.strip() for n in allowed.split(",") if n.strip()}
    for dist in importlib.metadata.distributions():
        if dist.metadata["Name"] not in names:
            continue
        for ep in dist.entry_points:
            if ep.group == GROUP and manager.get_plugin(ep.name) is None:
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

    def register_diagnostic(name: str, function: Callable) -> None:
        if name in result.diagnostics and result.diagnostics[name] is not function:
            raise PluginError(f"diagnostic {name!r} is registered twice")
        result.diagnostics[name] = function
        result.providers[("diagnostic", name)] = _provider(function, distributions)

    hook.register_diagnostics(register=register_diagnostic)
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
