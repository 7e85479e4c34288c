"""What plait knows about the ``test`` provider without importing its backend."""

from __future__ import annotations

from plait.backends.spec import ProviderSpec

__all__ = ["SPEC"]

SPEC = ProviderSpec(
    name="test",
    backend="plait.backends.test.backend:TestBackend",
    free=True,  # no model runs: its calls cost nothing unless the endpoint sets a "price"
    in_process=True,  # each process answers its own calls: nothing to share
)
"""The test provider (``"test"``): answers every call in-process, for users' own tests.

Its replies are made from each request's schema, or given as ``backend_options``
(``replies``, ``function``); see `plait.backends.test.backend.TestBackend`.
"""
