"""Shared HTTP plumbing: problem+json errors, body limits, paging, idempotency."""

from atlas.api.errors import problem_exception_handler
from atlas.api.parsers import LimitedJSONParser

__all__ = ["LimitedJSONParser", "problem_exception_handler"]
