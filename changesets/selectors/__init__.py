"""Reads: the log (lists, history), as-of projections and the change feed.

Selectors return querysets or plain data and never write.
"""
