"""Hook specifications: the whole surface a dpppl plugin implements.

A plugin is a module with functions marked ``@dpppl.hookimpl``, named in its distribution's entry
points under the group ``dpppl``::

    [project.entry-points.dpppl]
    my_mechanism = "my_package.plugin"

Built-in and third-party plugins load the same way.  Every hook receives a ``register`` callback;
call it once per class the plugin provides.
"""

from __future__ import annotations

from collections.abc import Callable

import pluggy

hookspec = pluggy.HookspecMarker("dpppl")
hookimpl = pluggy.HookimplMarker("dpppl")


@hookspec
def register_mechanisms(register: Callable[[type], None]) -> None:
    """Register mechanism classes: call ``register(cls)`` for each subclass of
    :class:`dpppl.Mechanism` the plugin provides."""


@hookspec
def register_accountants(register: Callable[[type], None]) -> None:
    """Register accountant classes: call ``register(cls)`` for each subclass of
    :class:`dpppl.Accountant` the plugin provides."""
