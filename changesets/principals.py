"""The system principal: the author of writes made by operators' commands.

It is an ordinary, inactive user (it cannot log in or hold a token), so
changesets it authors are attributable like any other. Commands run by an
operator with shell access skip role checks; ``--user`` names a real author
instead, and then that user's roles apply.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import User

SYSTEM_USERNAME = "atlas-system"


def system_user() -> User:
    user, _ = get_user_model().objects.get_or_create(
        username=SYSTEM_USERNAME, defaults={"is_active": False}
    )
    return user
