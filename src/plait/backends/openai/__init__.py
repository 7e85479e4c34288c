"""The OpenAI-compatible provider (``"openai"``): any server of the chat-completions protocol.

* `backend.py`: `OpenAICompatBackend`, the live calls (dialects, the
  ``response_format`` fallback, streaming);
* `_wire.py`: request bodies and reply readers, the one mapping both
  transports and the Batch API use;
* `_transports.py`: how a body reaches the server, over plait's own HTTP
  client (`_http.py`: keep-alive connections, httptools' parser) or the
  official SDK, with their failures turned into plait errors;
* `_sse.py`: the Server-Sent Events reader of streamed replies;
* `batch.py`: the Batch API (files, batches, result files);
* `spec.py`: `SPEC`, its `ProviderSpec`: the facts the rest of plait reads
  without importing the backend (the package imports its backend lazily).

Importing this package loads neither httptools nor the SDK: the transports
import them on their first call, so that ``import plait`` stays fast.
"""

from typing import TYPE_CHECKING

from plait import _lazy

if TYPE_CHECKING:
    from plait.backends.openai.backend import OpenAICompatBackend

__all__ = ["OpenAICompatBackend"]

_HOMES = {
    "OpenAICompatBackend": "plait.backends.openai.backend",
}

__getattr__, __dir__ = _lazy.exports(__name__, _HOMES, globals(), __all__)
