"""Mellea's components, kept at this import path for code that uses it.

They live in `plait.porting.mellea` with the rest of Mellea's interface; this
module only names them, so ``from plait.backends.components import CBlock``
keeps working.
"""

from plait.porting.mellea import CBlock, Component, generate_walk, render

__all__ = ["CBlock", "Component", "generate_walk", "render"]
