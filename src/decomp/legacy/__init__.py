"""Pre-refactor implementations, kept beside the new ones as live references."""

from decomp.legacy.ci_init import init_ci_function
from decomp.legacy.forward import clean_output, clean_output_and_activations, read_activations
from decomp.legacy.sources_init import init_sources

__all__ = [
    "clean_output",
    "clean_output_and_activations",
    "init_ci_function",
    "init_sources",
    "read_activations",
]
