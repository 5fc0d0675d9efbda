"""Entry points of lmshards: options, the materialize pipeline and the ``lmshards`` CLI.

Every entry point imports Apache Beam, so it is imported here first, without the warnings
it logs at import (:mod:`pipelines.beam_logging`).
"""

from pipelines.beam_logging import import_beam_quietly

__version__ = "0.1.0"

import_beam_quietly()
