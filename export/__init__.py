"""spotstop export."""
