"""The package version, importable from anywhere without loading the package's entry points."""

__version__ = "0.1.0"
