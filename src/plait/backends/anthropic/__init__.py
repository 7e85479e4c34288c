"""The Anthropic provider (``"anthropic"``): Claude models through the official SDK.

* `backend.py`: `AnthropicBackend`, the live calls and their failures;
* `_wire.py`: request bodies and reply readers, shared by live calls and
  the Batch API, so a batch asks exactly what the live call would;
* `batch.py`: Message Batches (`AnthropicBatchClient`).

Importing this package does not load the SDK: the backend imports it on its
first call, so that ``import plait`` stays fast.
"""

from plait.backends.anthropic.backend import AnthropicBackend

__all__ = ["AnthropicBackend"]
