"""``module.forward(...)`` called from a script runs the module instead of returning a coroutine.

A module's ``async def forward`` is what plait's executor awaits. Called by
hand from synchronous code with no event loop running (udspy's
``predictor.forward(question=...)``, its synchronous entry point), it would
return a coroutine that nothing runs. `SyncEntry` wraps such a ``forward`` on
the class: read from an instance, it gives a method that, with no loop
running in this thread, runs the module as ``module.run_sync(...)`` does
(with its resources, callbacks and traces) and returns the result; inside a
running loop, where the executor and ``super().forward(...)`` call it, it
returns the coroutine as before. Read from the class it is the plain
function, so what inspects ``type(module).forward`` sees what was written.
"""

from __future__ import annotations

import functools
import sys
import types
from typing import Any


class SyncEntry:
    """The class attribute standing for an ``async def forward`` (see the module docstring)."""

    def __init__(self, function: Any) -> None:
        self.function = function

        def entry(module: Any, *args: Any, **kwargs: Any) -> Any:
            # No asyncio loaded means no loop running (``import plait`` does not load it).
            asyncio = sys.modules.get("asyncio")
            if asyncio is None or asyncio._get_running_loop() is None:
                return module.run_sync(*args, **kwargs)  # a script: nothing would run it
            return function(module, *args, **kwargs)

        self._entry = functools.update_wrapper(entry, function)

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        if instance is None:
            return self.function
        return types.MethodType(self._entry, instance)
