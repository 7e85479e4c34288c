"""The test provider (``"test"``): a backend that answers without a model, for tests.

* `backend.py`: `TestBackend`, which answers every call with a valid reply
  made from the request's schema, or with the replies or the function it was
  given, and records each request in ``calls``;
* `_made.py`: a valid value made from a JSON schema;
* `spec.py`: `SPEC`, its `ProviderSpec`.

`plait.testing` exports `TestBackend` too: that is where a user's tests find it.
"""

from typing import TYPE_CHECKING

from plait import _lazy

if TYPE_CHECKING:
    from plait.backends.test.backend import TestBackend

__all__ = ["TestBackend"]

_HOMES = {"TestBackend": "plait.backends.test.backend"}

__getattr__, __dir__ = _lazy.exports(__name__, _HOMES, globals(), __all__)
