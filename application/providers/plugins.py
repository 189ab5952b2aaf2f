"""Your own model providers: factories named by module or by entry point, loaded in every process.

A provider plugin is a callable that takes a ``ProviderContext`` and returns
a ``Provider`` (``providers.port``: a ``name`` and ``complete(request) ->
ModelReply``). It is found in two ways, both read by every process of every
role at start-up (``serve --split``'s children too, since they read the same
settings and the same installed distributions):

- ``TURNLOG_PROVIDER_MODULES``: comma-separated ``module:attribute`` names
  (``attribute`` defaults to ``provider``), imported from ``sys.path``;
- the ``turnlog.providers`` entry-point group of installed distributions,
  each entry point naming such a factory (``name = "package.module:factory"``).

A bad plugin (not importable, not callable, answering something that is
not a provider, or a name already taken) stops start-up with the cause and
the plugin named: a process never runs with a provider missing.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from turnlog.application.errors import ConfigurationError
from turnlog.application.providers.port import Provider
from turnlog.application.tools.port import ToolSpec

PROVIDERS_GROUP = "turnlog.providers"
TOOLS_GROUP = "turnlog.tools"


@dataclass(frozen=True)
class ProviderContext:
    """What a provider factory is given: the tools' declarations and the default model."""

    # The declarations of the tools a request names (a request's ``tools``; all for ()).
    tool_specs: Callable[[Sequence[str]], list[ToolSpec]]
    default_model: str


Factory = Callable[[ProviderContext], Provider]


def provider_factories(setting: str | None) -> list[tuple[str, Factory]]:
    """The factories named by ``TURNLOG_PROVIDER_MODULES`` and by entry points, in that order."""
    found = [(name, _attribute(name)) for name in _names(setting)]
    for point in entry_points(group=PROVIDERS_GROUP):
        where = f"entry point {point.name} ({point.value})"
        try:
            found.append((where, point.load()))
        except Exception as exc:
            raise ConfigurationError(f"provider {where} cannot be loaded: {_why(exc)}") from None
    return found


def plugin_providers(
    setting: str | None, context: ProviderContext, taken: Iterable[str]
) -> list[Provider]:
    """Build each plugin's provider; refuse a bad one, naming it and the cause."""
    names = set(taken)
    providers: list[Provider] = []
    for where, factory in provider_factories(setting):
        if not callable(factory):
            raise ConfigurationError(f"provider {where} is not callable")
        try:
            provider = factory(context)
        except Exception as exc:
            raise ConfigurationError(f"provider {where} failed to start: {_why(exc)}") from None
        name = getattr(provider, "name", None)
        if (
            not isinstance(name, str)
            or not name
            or not callable(getattr(provider, "complete", None))
        ):
            raise ConfigurationError(
                f"provider {where} gave {type(provider).__name__}, not a provider"
                " (it needs a non-empty str `name` and a `complete(request)` method)"
            )
        if name in names:
            raise ConfigurationError(f"provider {where} is named {name!r}, a name already taken")
        names.add(name)
        providers.append(provider)
    return providers


def entry_point_tool_modules() -> list[str]:
    """Modules of ``@turnlog.tool`` functions named by the ``turnlog.tools`` entry points."""
    return [point.value.split(":", 1)[0] for point in entry_points(group=TOOLS_GROUP)]


def _names(setting: str | None) -> Sequence[str]:
    return [n.strip() for n in (setting or "").split(",") if n.strip()]


def _attribute(name: str) -> Any:
    module_name, _, attribute = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ConfigurationError(
            f"provider module {module_name!r} cannot be imported: {_why(exc)}"
            " (is its folder on PYTHONPATH, or the package installed?)"
        ) from None
    attribute = attribute or "provider"
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise ConfigurationError(f"provider module {module_name!r} has no {attribute!r}") from None


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
