"""Names a package exports but imports only when first read (PEP 562).

`import plait` must stay cheap, so a package lists where each of its public
names lives and loads that module on first use; the value is then kept in the
package's namespace, so later reads cost nothing.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["exports"]


def exports(
    package: str,
    homes: Mapping[str, str],
    namespace: dict[str, Any],
    public: Iterable[str],
    modules: Mapping[str, str] | None = None,
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """Returns the ``__getattr__`` and ``__dir__`` of ``package``.

    ``homes`` maps a name to the module that defines it; ``modules`` maps a
    name to a module that *is* the value (``plait.settings``); ``namespace`` is
    the package's ``globals()``, where a loaded value is kept.
    """
    whole_modules = dict(modules or {})
    listed = set(public)

    def __getattr__(name: str) -> Any:
        if name in whole_modules:
            value = importlib.import_module(whole_modules[name])
        else:
            home = homes.get(name)
            if home is None:
                raise AttributeError(f"module {package!r} has no attribute {name!r}")
            value = getattr(importlib.import_module(home), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *listed})

    return __getattr__, __dir__
