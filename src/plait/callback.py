"""An alias module for ported code: `BaseCallback` and ``@with_callbacks`` under one path.

Code ported from a framework that kept both in a ``callback`` module imports
them from here unchanged; plait's own module is
`plait.callbacks`, and ``with_callbacks`` is `plait.porting.with_callbacks`.
"""

from plait.callbacks import BaseCallback
from plait.porting import with_callbacks

__all__ = ["BaseCallback", "with_callbacks"]
