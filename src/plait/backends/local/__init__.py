"""The local provider (``"local"``): a GGUF model run in-process by llama-cpp-python.

* `backend.py`: `LocalBackend` (loading the model, calls, streaming, tools
  and structured output through grammars), `default_model_path` and
  `default_threads`;
* `_prompt.py`: requests into chat calls and replies back, pure data
  mapping that needs no compiled library;
* `_llama.py`: the llama-cpp-python side (loading, the chat format a model
  shows, grammars).

Importing this package does not load llama_cpp: the backend imports it when
a model is first loaded, so that ``import plait`` stays fast.
"""

from plait.backends.local.backend import LocalBackend, default_model_path, default_threads

__all__ = ["LocalBackend", "default_model_path", "default_threads"]
