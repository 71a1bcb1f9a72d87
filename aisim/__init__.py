"""aisim: the thin command line over perfmodel, calibration and fl."""

__version__ = "0.1.0"
