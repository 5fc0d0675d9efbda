"""Order and state: which sample comes when, on which rank and worker, and how to resume.

Holds the epoch's global order (``order``), the rank/worker split and the resumable state
(``state``), progress shared with DataLoader workers (``progress``), the resumable
``IterableDataset`` base (``stream``) and the DataLoader that keeps its state
(``dataloader``).

May import: the standard library, numpy, torch (``progress``, ``stream`` and ``dataloader``),
:mod:`loaders.collation`, :mod:`schemas`; never Beam, never :mod:`loaders.integrations` (the
stream refuses a plain HF ``Trainer`` by its classes' names).
"""
