"""The local provider (``"local"``): a GGUF model run in-process by llama-cpp-python.

* `backend.py`: `LocalBackend` (loading the model, calls, streaming, tools
  and structured output through grammars), `default_model_path` and
  `default_threads`;
* `_prompt.py`: requests into chat calls and replies back, pure data
  mapping that needs no compiled library;
* `_llama.py`: the llama-cpp-python side (loading, rendering a chat call
  into the completion its format asks for, the chat format a model shows,
  grammars);
* `_decoder.py`: the decode loop that runs every call in flight in one
  llama.cpp batch, each with its own sampler chain, stop strings and stream;
* `spec.py`: `SPEC`, its `ProviderSpec`: the facts the rest of plait reads
  without importing the backend (the package imports its backend lazily).

Importing this package does not load llama_cpp: the backend imports it when
a model is first loaded, so that ``import plait`` stays fast.
"""

from typing import TYPE_CHECKING

from plait import _lazy

if TYPE_CHECKING:
    from plait.backends.local.backend import LocalBackend, default_model_path, default_threads

__all__ = ["LocalBackend", "default_model_path", "default_threads"]

_HOMES = {
    "LocalBackend": "plait.backends.local.backend",
    "default_model_path": "plait.backends.local.backend",
    "default_threads": "plait.backends.local.backend",
}

__getattr__, __dir__ = _lazy.exports(__name__, _HOMES, globals(), __all__)
