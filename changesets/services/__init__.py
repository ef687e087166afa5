"""Writes to the changeset log: apply (the one write path), revert, interchange.

Each module holds services that open their own transaction; nothing is
re-exported here, so an import names the module that owns the write.

Every write to the entity store goes through :mod:`changesets.services.apply`
(invariant 1); revert and import plan their ops and hand them to it.
"""
