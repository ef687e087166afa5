"""Writes: apply, revert, interchange.

Every write to the entity store goes through :mod:`changesets.services.apply`
(invariant 1); revert and import plan their ops and hand them to it.
"""
