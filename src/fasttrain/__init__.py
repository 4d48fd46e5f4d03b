"""fasttrain: measure which training speed-up is worth it on your GPU."""

import time

__version__ = "0.1.0"
STARTED = time.perf_counter()  # the process's start, near enough: fasttrain is the first thing it imports
