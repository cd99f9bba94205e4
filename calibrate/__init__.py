"""spotstop calibrate."""
