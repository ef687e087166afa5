"""Verifiable archives of the changeset log (issue 21): cuts, segments, checkpoints.

The room of its own for moving old history out of PostgreSQL into signed
files anyone can check against the chain (``docs/retention.md``):

- :mod:`.segments`, :mod:`.signing`, :mod:`.offline` — the file format, the
  Ed25519 checkpoint signature and the offline verifier. Pure Python with no
  Django (an auditor runs ``python -m changesets.archive.offline`` years later
  with only the files and the public key).
- :mod:`.models` — the durable record of each cut and its state machine, its
  segments, the state at the cut (``ArchiveBase``), retention and rewrites.
- :mod:`.archiver` — the state machine (planned → written → verified →
  signed → switched → removed), resumable at every step; :mod:`.plan` picks
  and clamps the cut; :mod:`.base` keeps the state at the cut;
  :mod:`.hot` is the only code that removes log rows.
- :mod:`.boundary` — what reads need: the current cut, the ``archived_before``
  marker and the 410s.

Nothing is imported here, so the offline modules load without Django.
"""
