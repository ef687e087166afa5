"""Restore a 10,000-entity scope to an earlier point, as one changeset.

    .venv/bin/python bench/restore_scope.py [--entities 10000] [--changed 10000] [--repeat 5]

Builds (once per run, in its own database ``atlas_bench_restore``; a fresh
namespace each run) a namespace of ``--entities`` entities through the write
service: one batch creates them all (the point X), then a batch moves
``--changed`` of them on (5 % of those deleted, the rest updated, and as
many new ones created as were deleted), so that many keys differ from X.
Then times,
end to end through ``changesets.services.restore.scope_restore``:

- the dry run (both states read set-based, diffed, the plan checked under
  the locks, nothing written),
- the real restore: one ``RestoreScope`` changeset of ``--changed`` ops,
  reverted again untimed between repeats,
- a restore to the head (nothing differs: the cost of reading and diffing).

Prints the median of each in milliseconds.
"""

from __future__ import annotations

import argparse
import statistics
import time

from _setup import setup

DATABASE = "atlas_bench_restore"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--entities", type=int, default=10_000)
    parser.add_argument("--changed", type=int, default=10_000, help="entities that differ")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    setup(database=DATABASE)

    from django.conf import settings
    from django.contrib.auth.models import User

    from changesets.models import Changeset, Rpc
    from changesets.ops import DeleteOp, PutOp
    from changesets.services.apply import changeset_apply
    from changesets.services.restore import scope_restore
    from changesets.services.revert import changeset_revert
    from entities.models import Namespace
    from entities.store import EntityKey, baseline

    settings.ATLAS_MAX_BATCH_OPS = max(settings.ATLAS_MAX_BATCH_OPS, args.entities)
    actor, _ = User.objects.get_or_create(username="bench", defaults={"is_superuser": True})
    ns = f"bench.restore{int(time.time())}"
    Namespace.objects.create(name=ns)
    n = args.entities
    keys = [EntityKey(ns, "item", f"e{i:06}") for i in range(n)]
    payload = "x" * 80

    def write(ops: list) -> Changeset:
        result = changeset_apply(store=baseline, actor=actor, ops=ops, rpc=Rpc.BATCH_MUTATE)
        assert result.changeset is not None
        return result.changeset

    started = time.perf_counter()
    point = write([PutOp(k, {"v": 0, "i": i, "payload": payload}) for i, k in enumerate(keys)])
    changed = min(args.changed, n)
    gone = changed // 20
    moved: list = [DeleteOp(k) for k in keys[:gone]]
    moved += [
        PutOp(k, {"v": 1, "i": i, "payload": payload})
        for i, k in enumerate(keys[gone : changed - gone])
    ]
    moved += [PutOp(EntityKey(ns, "item", f"new{i:06}"), {"v": 1}) for i in range(gone)]
    write(moved)  # ``changed`` keys now differ from X: as many ops to restore
    print(f"built {n} entities, then moved them all on, in {time.perf_counter() - started:.1f} s")

    def timed(**kw) -> tuple[float, object]:
        started = time.perf_counter()
        result = scope_restore(store=baseline, actor=actor, namespace=ns, **kw)
        return (time.perf_counter() - started) * 1000, result

    dry, real, noop = [], [], []
    for _ in range(args.repeat):
        ms, result = timed(as_of=point, dry_run=True)
        dry.append(ms)
        assert len(result.ops) == changed, len(result.ops)
        ms, result = timed(as_of=point)
        real.append(ms)
        assert result.changeset is not None and result.changeset.op_count == changed
        head = Changeset.objects.order_by("-seq").first()
        ms, nothing = timed(as_of=head)
        noop.append(ms)
        assert nothing.changeset is None and not nothing.ops
        changeset_revert(store=baseline, actor=actor, changeset=result.changeset)

    def show(name: str, values: list[float]) -> None:
        print(f"{name:<44} median {statistics.median(values):7.1f} ms  (min {min(values):.1f})")

    print(f"scope of {n} entities, {changed} of them differ, {args.repeat} repeats:")
    show("restore, dry run (read, diff, plan under lock)", dry)
    show(f"restore: one RestoreScope changeset of {changed} ops", real)
    show("restore to the head (nothing differs)", noop)


if __name__ == "__main__":
    main()
