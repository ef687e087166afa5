"""The ``plan_token`` of a mutating tool: look before you leap, by construction.

A mutating tool called without ``plan_token`` only dry-runs, and answers
the plan (what would be written) with a token signed over it: the tool, the
caller, the call's arguments and the plan's digest
(:func:`changesets.services.plans.plan_digest`), like the admin's signed
revert preview. Called again with the same arguments and that token, it
writes, handing the digest to the write service as ``expect_plan``: under
its row locks the service refuses (409 ``plan-changed``) a write that would
record anything else, so what lands is exactly what was shown, or nothing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from django.core import signing

from atlas.exceptions import BadRequest
from atlas.mcp.caller import Caller
from changesets.ops import canonical

# How long a dry run stays confirmable (as the admin's revert preview).
PLAN_MAX_AGE_SECONDS = 3600
_SALT = "atlas.mcp.plan"
MSG_BAD_TOKEN = (
    "The plan_token is not valid for this call (expired, altered, another caller's,"
    " or issued for other arguments). Call again without plan_token to dry-run."
)


class PlanTokenInvalid(BadRequest):
    type, title = "plan-token-invalid", "Invalid plan token"


def arguments_digest(arguments: Mapping[str, Any]) -> str:
    """The call's arguments but ``plan_token``, canonically: a token confirms one call."""
    rest = {k: v for k, v in arguments.items() if k != "plan_token"}
    return hashlib.sha256(canonical(rest).encode()).hexdigest()


def sign(caller: Caller, *, tool: str, arguments: Mapping[str, Any], plan: str) -> str:
    payload = {"t": tool, "u": caller.user.pk, "a": arguments_digest(arguments), "p": plan}
    return signing.dumps(payload, salt=_SALT, compress=True)


def read(caller: Caller, *, tool: str, arguments: Mapping[str, Any], token: str) -> str:
    """The plan digest ``token`` confirms, if it is this caller's, for this call, and fresh."""
    try:
        payload = signing.loads(token, salt=_SALT, max_age=PLAN_MAX_AGE_SECONDS)
    except signing.BadSignature:  # also SignatureExpired
        raise PlanTokenInvalid(MSG_BAD_TOKEN, pointer="/plan_token") from None
    expected = {"t": tool, "u": caller.user.pk, "a": arguments_digest(arguments)}
    if not isinstance(payload, dict) or any(payload.get(k) != v for k, v in expected.items()):
        raise PlanTokenInvalid(MSG_BAD_TOKEN, pointer="/plan_token")
    plan = payload.get("p")
    if not isinstance(plan, str):
        raise PlanTokenInvalid(MSG_BAD_TOKEN, pointer="/plan_token")
    return plan
