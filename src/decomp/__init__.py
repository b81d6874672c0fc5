"""decomp: parameter decomposition (SPD) on a GLU transformer and toy targets."""

from decomp.model import DecomposedModel

__all__ = ["DecomposedModel"]
