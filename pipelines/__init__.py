"""Entry points of lmshards: options, the materialize pipeline and the ``lmshards`` CLI.

Apache Beam is not imported here: the CLI, the flag parsers and the inspection commands do
without it, so that ``lmshards --help`` and a mistyped flag answer at once. The modules that
need Beam import it through :func:`pipelines.beam_logging.import_beam_quietly` first (without
the warnings it logs at import), once lmshards' own flags are parsed.

May import: every module of :mod:`transforms` and :mod:`schemas`, :mod:`loaders.inspection` (the
inspection commands), any installed package but torch.
"""

__version__ = "0.1.0"
