"""Thin adapters for code written against the seeds' spellings (see ``docs/porting.md``).

plait's own API is the primary one; where a seed spells a thing differently
and no alias on plait's own objects can carry the spelling, the adapter lives
here. Each is a few lines over plait's API and says which seed it serves.
"""

from __future__ import annotations

from typing import Any

__all__ = ["signature"]


def signature(text: str, instructions: str | None = None) -> Any:
    """Returns the signature a string describes: dsprrr's ``signature("question -> answer")``.

    The same as `plait.Signature.from_string`; dsprrr's type words are
    understood too (``string``, ``integer``, ``number``, ``boolean``,
    ``enum('a', 'b')``)::

        sig = signature("text -> sentiment: enum('positive', 'negative', 'neutral')")

    Raises:
        SignatureSyntaxError: the text is malformed (the message shows where).
    """
    from plait.signatures import Signature

    return Signature.from_string(text, instructions=instructions)
