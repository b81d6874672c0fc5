"""Targets to decompose: the GLU transformer and toy models."""

from decomp.targets.glu_transformer import GLUConfig, GLUTransformer
from decomp.targets.toy import (
    TMS,
    ResidMLP,
    ResidMLPConfig,
    SimpleMLP,
    SimpleMLPConfig,
    TMSConfig,
)

__all__ = [
    "TMS",
    "GLUConfig",
    "GLUTransformer",
    "ResidMLP",
    "ResidMLPConfig",
    "SimpleMLP",
    "SimpleMLPConfig",
    "TMSConfig",
]
