"""spotstop diagnostics."""
