"""aisim: the thin command line over perfmodel, calibration and fl."""

from simbase.version import version

__version__ = version()
