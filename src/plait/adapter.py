"""Seed 003's module path ``udspy.adapter``: the adapters of `plait.signatures.adapters`.

Code ported from udspy imports ``ChatAdapter`` from here unchanged; plait's
default adapter is ``JSONAdapter``.
"""

from plait.signatures.adapters import Adapter, ChatAdapter, JSONAdapter, PlainAdapter

__all__ = ["Adapter", "ChatAdapter", "JSONAdapter", "PlainAdapter"]
