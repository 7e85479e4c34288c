"""An alias module for ported code: the adapters of `plait.signatures.adapters`.

Code ported from a framework with an ``adapter`` module imports ``ChatAdapter``
from here unchanged; plait's
default adapter is ``JSONAdapter``.
"""

from plait.signatures.adapters import Adapter, ChatAdapter, JSONAdapter, PlainAdapter

__all__ = ["Adapter", "ChatAdapter", "JSONAdapter", "PlainAdapter"]
