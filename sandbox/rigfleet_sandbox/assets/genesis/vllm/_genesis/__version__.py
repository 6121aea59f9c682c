"""Genesis version string (SIMULATED stand-in).

Stale on purpose, as upstream's was at v7.72.2 (it said v7.63.x): identify a v7 tree by its git SHA.
"""

__version__ = "v7.63.x"
