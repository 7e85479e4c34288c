"""Seed 003's module path ``udspy.callback``: `BaseCallback` and ``@with_callbacks``.

Code ported from udspy imports these from here unchanged; plait's own module is
`plait.callbacks`, and ``with_callbacks`` is `plait.porting.with_callbacks`.
"""

from plait.callbacks import BaseCallback
from plait.porting import with_callbacks

__all__ = ["BaseCallback", "with_callbacks"]
