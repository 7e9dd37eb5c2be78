"""composable-dra: shared pieces of the suite (command line, logging, metrics)."""

__version__ = "0.1.0"
