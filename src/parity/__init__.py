"""parity: differential equivalence testing for JAX model refactors."""
