"""Pre-refactor implementations, kept beside the new ones as live references."""

from decomp.legacy.forward import clean_output, clean_output_and_activations, read_activations

__all__ = ["clean_output", "clean_output_and_activations", "read_activations"]
