"""fasttrain: measure which training speed-up is worth it on your GPU."""

__version__ = "0.1.0"
