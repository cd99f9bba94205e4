"""spotstop calibrate: offline fitting of reference statistics and cuts from scores/logs."""

from calibrate._frozen import FrozenFit, fit_frozen

__all__ = ["FrozenFit", "fit_frozen"]
