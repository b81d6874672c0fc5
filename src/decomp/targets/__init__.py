"""Targets to decompose: the GLU transformer and toy models."""
