"""decomp: parameter decomposition (SPD) on a GLU transformer and toy targets."""
