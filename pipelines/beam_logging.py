"""How much of Apache Beam's logging a user sees.

Beam logs on its own at import and while it runs: without the ``[gcp]`` extra, ``import
apache_beam`` logs "apitools not found ..." on the root logger (every command, even
``--help``), and the workers of ``--direct_running_mode=multi_processing`` relay their
warnings (several hundred characters each, e.g. "No semi_persistent_directory found") through
the job service's logger. lmshards reports what matters itself, so by default both stay
quiet: :func:`import_beam_quietly` raises the root logger's level for the one import, and
:func:`set_beam_verbosity` keeps the relayed worker messages below ERROR out
(``--verbose`` shows them). Only logger levels are set: Beam's public logging configuration.
"""

from __future__ import annotations

import logging

__all__ = ["WORKER_RELAY_LOGGER", "import_beam_quietly", "set_beam_verbosity"]

#: The logger through which the local job service relays its workers' log messages.
WORKER_RELAY_LOGGER = "apache_beam.runners.portability.local_job_service"


def import_beam_quietly() -> None:
    """Import ``apache_beam`` with the root logger at ERROR, so its import-time warnings stay unseen."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        import apache_beam  # noqa: F401
    finally:
        root.setLevel(level)


def set_beam_verbosity(verbose: bool) -> None:
    """Show the workers' relayed messages from WARNING up when ``verbose``, else from ERROR up."""
    logging.getLogger(WORKER_RELAY_LOGGER).setLevel(logging.NOTSET if verbose else logging.ERROR)
