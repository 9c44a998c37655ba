"""rayline's version, in a module of its own: modules that record it (artifacts, cache keys, the V2
server metadata) import it from here, not from the package, whose `run`/`load_model` import them."""

__version__ = "0.1.0"
