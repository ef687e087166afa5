"""Post-commit work: the journal (the outbox table), the relay that publishes it
(or hands it to the workers when hooks are registered), subscription pumps and
their webhook deliveries, and the metrics that say how far behind all of it is.

Nothing here runs inside a write transaction: the write service only inserts
the journal row, and everything here reads committed changesets. Nothing here
imports the write services either.
"""
