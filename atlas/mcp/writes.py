"""Mutating tools: a dry run unless confirmed with the dry run's ``plan_token``.

Each calls the write service the API calls (``changeset_apply`` for a batch,
``changeset_revert`` for a revert), validating its input with the API's own
body serializers, so the same rules, pointers and role checks apply (a
reader is refused 403, an invisible changeset is 404). What is new is only
the confirm step (:mod:`atlas.mcp.plans`) and the ``context`` its writes
record (:func:`atlas.mcp.caller.write_context`).

Adding a mutating tool (``restore_entity`` when its service exists): write
a ``run(dry_run, expect_plan) -> Outcome`` that calls the service with both
(the service passes ``expect_plan`` on to ``changeset_apply``), and hand it
to :func:`confirmable`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from atlas.api import strict
from atlas.api.branch import store_named
from atlas.api.representations import changeset_repr
from atlas.exceptions import NotFound
from atlas.mcp import plans
from atlas.mcp.caller import Caller, write_context
from changesets.api.serializers import RevertBodySerializer
from changesets.models import Rpc
from changesets.selectors.asof import as_of_resolve
from changesets.services.apply import changeset_apply
from changesets.services.netchange import NetChange
from changesets.services.restore import entity_restore
from changesets.services.result import ApplyResult
from changesets.services.revert import changeset_revert, revert_target
from entities import access
from entities.api.batch import parse_batch
from entities.api.lookups import path_key
from entities.api.restore import EntityRestoreBodySerializer

NEXT_STEP = (
    "Nothing was written. Review `changes`; to write exactly this, call {tool} again"
    " with the same arguments and plan_token."
)
NOTHING_TO_DO = "Nothing would change, so there is nothing to confirm."


@dataclass(frozen=True)
class Outcome:
    """One run of a mutating tool: the service's result and the tool's own fields."""

    applied: ApplyResult
    body: dict[str, Any]


Run = Callable[[bool, str | None], Outcome]


def _change_repr(change: NetChange) -> dict[str, Any]:
    return {
        "namespace": change.key.namespace,
        "kind": change.key.kind,
        "slug": change.key.slug,
        "op": change.op,
        "before_version": change.before_version,
        "after_version": change.after_version,
        "before": change.before,
        "after": change.after,
    }


def confirmable(
    caller: Caller,
    *,
    tool: str,
    arguments: Mapping[str, Any],
    plan_token: str | None,
    run: Run,
) -> dict[str, Any]:
    """Dry-run ``run`` and sign its plan, or, given a ``plan_token``, write exactly that plan.

    1. No token: ``run(True, None)``; the answer shows each net change (both
       images and versions) and, if anything would change, a ``plan_token``.
    2. A token: it must be this caller's, for this tool and these arguments,
       and under an hour old (else 400 ``plan-token-invalid``); then
       ``run(False, digest)``, and the write service refuses, under its locks,
       anything but that plan (409 ``plan-changed``).
    """
    if plan_token is None:
        outcome = run(True, None)
        changes = outcome.applied.changes
        token = (
            plans.sign(caller, tool=tool, arguments=arguments, plan=outcome.applied.plan)
            if changes
            else None
        )
        return {
            **outcome.body,
            "dry_run": True,
            "changes": [_change_repr(c) for c in changes],
            "plan_token": token,
            "next_step": NEXT_STEP.format(tool=tool) if token else NOTHING_TO_DO,
        }
    expected = plans.read(caller, tool=tool, arguments=arguments, token=plan_token)
    outcome = run(False, expected)
    return {
        **outcome.body,
        "dry_run": False,
        "changes": [_change_repr(c) for c in outcome.applied.changes],
        "plan_token": None,
    }


def _rendered(caller: Caller, applied: ApplyResult) -> dict[str, Any] | None:
    """The written changeset as the caller sees it (the API's write answers do the same)."""
    if applied.changeset is None:
        return None
    return changeset_repr(
        applied.changeset,
        applied.revisions,
        namespaces=access.readable_namespaces(caller.user),
    )


def write_entities(
    caller: Caller,
    *,
    ops: Sequence[Any],
    comment: str,
    metadata: dict[str, Any] | None,
    branch: str,
    plan_token: str | None,
) -> dict[str, Any]:
    """``POST /batch`` as a tool: the body checked by the API's own parser, one changeset."""
    body: dict[str, Any] = {"ops": list(ops), "comment": comment}
    if metadata is not None:
        body["metadata"] = metadata
    parsed_ops, parsed_comment, _, parsed_metadata = parse_batch(body)
    store = store_named(branch, user=caller.user)

    def run(dry_run: bool, expect_plan: str | None) -> Outcome:
        applied = changeset_apply(
            store=store,
            actor=caller.user,
            ops=parsed_ops,
            rpc=Rpc.BATCH_MUTATE,
            comment=parsed_comment,
            dry_run=dry_run,
            metadata=parsed_metadata,
            context=write_context(caller),
            expect_plan=expect_plan,
        )
        results = [
            {"pointer": r.pointer, "status": r.status, "version": r.version}
            for r in applied.results
        ]
        return Outcome(applied, {"changeset": _rendered(caller, applied), "results": results})

    arguments = {"ops": body["ops"], "comment": comment, "metadata": metadata, "branch": branch}
    return confirmable(
        caller, tool="write_entities", arguments=arguments, plan_token=plan_token, run=run
    )


def revert_changeset(
    caller: Caller,
    *,
    changeset_id: str,
    comment: str,
    metadata: dict[str, Any] | None,
    branch: str,
    plan_token: str | None,
) -> dict[str, Any]:
    """``POST /changesets/{id}/revert`` as a tool (404 before the body is read, as there)."""
    target = revert_target(actor=caller.user, changeset_id=changeset_id)
    store = store_named(branch, user=caller.user)
    raw: dict[str, Any] = {"comment": comment}
    if metadata is not None:
        raw["metadata"] = metadata
    body = strict.validated(RevertBodySerializer, raw)

    def run(dry_run: bool, expect_plan: str | None) -> Outcome:
        result = changeset_revert(
            store=store,
            actor=caller.user,
            changeset=target,
            dry_run=dry_run,
            comment=body.get("comment", ""),
            metadata=body.get("metadata"),
            context=write_context(caller),
            expect_plan=expect_plan,
        )
        rendered = _rendered(caller, result.applied)
        return Outcome(result.applied, {"changeset": rendered, "ops": result.ops})

    arguments = {
        "changeset_id": changeset_id,
        "comment": comment,
        "metadata": metadata,
        "branch": branch,
    }
    return confirmable(
        caller, tool="revert_changeset", arguments=arguments, plan_token=plan_token, run=run
    )


def restore_entity(
    caller: Caller,
    *,
    namespace: str,
    kind: str,
    slug: str,
    version: int | None,
    as_of: str | None,
    as_of_time: str | None,
    comment: str,
    metadata: dict[str, Any] | None,
    branch: str,
    plan_token: str | None,
) -> dict[str, Any]:
    """``POST /entities/{ns}/{kind}/{slug}/restore`` as a tool: the body checked by the
    API's own serializer, the point resolved as there, one ``RestoreEntity`` changeset."""
    key = path_key(namespace, kind, slug)
    if not access.can_read(caller.user, namespace):
        raise NotFound("No such entity.")
    points = {"version": version, "as_of": as_of, "as_of_time": as_of_time}
    body, point = _restore_point(caller, {**points, "comment": comment, "metadata": metadata})
    store = store_named(branch, user=caller.user)

    def run(dry_run: bool, expect_plan: str | None) -> Outcome:
        done = entity_restore(
            store=store,
            actor=caller.user,
            key=key,
            version=body.get("version"),
            as_of=point,
            dry_run=dry_run,
            comment=body.get("comment") or "",
            metadata=body.get("metadata"),
            context=write_context(caller),
            expect_plan=expect_plan,
        )
        rendered = _rendered(caller, done.applied)
        return Outcome(
            done.applied, {"changeset": rendered, "restored_version": done.target.version}
        )

    arguments = {
        "namespace": namespace,
        "kind": kind,
        "slug": slug,
        "version": version,
        "as_of": as_of,
        "as_of_time": as_of_time,
        "comment": comment,
        "metadata": metadata,
        "branch": branch,
    }
    return confirmable(
        caller, tool="restore_entity", arguments=arguments, plan_token=plan_token, run=run
    )


def _restore_point(caller: Caller, raw: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """The restore body checked by the API's serializer (``None`` arguments left out),
    and the baseline changeset its ``as_of``/``as_of_time`` names (``None`` for a version)."""
    body = strict.validated(
        EntityRestoreBodySerializer, {k: v for k, v in raw.items() if v is not None}
    )
    if "version" in body:
        return body, None
    point = as_of_resolve(
        branch="",
        namespaces=access.readable_namespaces(caller.user),
        changeset_id=body.get("as_of"),
        at=body.get("as_of_time"),
        name="as_of",
    )
    return body, point
