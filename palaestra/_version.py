"""The package's version: the one place it is written (read by ``[tool.hatch.version]``)."""

__version__ = "0.1.0"
