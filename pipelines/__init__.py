"""Entry points of lmshards: options, the materialize pipeline and the ``lmshards`` CLI."""

__version__ = "0.1.0"
