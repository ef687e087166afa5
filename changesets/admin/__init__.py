"""Admin registrations for the changeset log (``log``) and subscriptions.

Django's autodiscovery imports this package; the modules register on import.
"""

from changesets.admin import archive, erasures, log, subscriptions  # noqa: F401
