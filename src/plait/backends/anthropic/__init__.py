"""The Anthropic provider (``"anthropic"``): Claude models through the official SDK.

* `backend.py`: `AnthropicBackend`, the live calls and their failures;
* `_wire.py`: request bodies and reply readers, shared by live calls and
  the Batch API, so a batch asks exactly what the live call would;
* `batch.py`: Message Batches (`AnthropicBatchClient`);
* `spec.py`: `SPEC`, its `ProviderSpec`: the facts the rest of plait reads
  without importing the backend (the package imports its backend lazily).

Importing this package does not load the SDK: the backend imports it on its
first call, so that ``import plait`` stays fast.
"""

from typing import TYPE_CHECKING

from plait import _lazy

if TYPE_CHECKING:
    from plait.backends.anthropic.backend import AnthropicBackend

__all__ = ["AnthropicBackend"]

_HOMES = {
    "AnthropicBackend": "plait.backends.anthropic.backend",
}

__getattr__, __dir__ = _lazy.exports(__name__, _HOMES, globals(), __all__)
