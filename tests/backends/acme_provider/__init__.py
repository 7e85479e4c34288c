"""A provider added the way a new built-in one is: this folder, and one line that registers it.

``acme`` is a hosted service of OpenAI's chat-completions protocol with its own key
variable and list prices; `spec.py` declares it, `backend.py` is its backend. The tests
register it with `plait.backends.providers.register(SPEC)` (a built-in provider is one
line in `plait.backends.providers._BUILT_IN` instead).
"""
