"""Writes to the changeset log: apply (the one write path), revert, interchange.

Each module holds services that open their own transaction; nothing is
re-exported here, so an import names the module that owns the write.
"""
