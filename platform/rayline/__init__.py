"""rayline: one YAML spec to a served model on Ray."""

__version__ = "0.1.0"
