"""Shared fixtures. Nothing here may import jax at module level: the parity plugin must set
the simulated device count before jax starts."""
