"""Encoding API pages: DRF's JSON renderer against Atlas's (orjson, ``atlas/api/renderers.py``).

    .venv/bin/python bench/renderers.py [--repeat 30]
    .venv/bin/python bench/renderers.py --smoke        # CI size, scratch output

One namespace is seeded (1,000 entities written by three 1,000-op batches);
then, for an entity list page (500), a feed page (1,000 records) and a
changeset list page (100 changesets, the batches' first 100 ops embedded
each), the page's data as the view returns it is rendered by both renderers,
interleaved, and the medians compared. The bytes are compared too: they must
be the same.
"""

from __future__ import annotations

import os
import statistics
import time
import uuid
from typing import Any

from _common import bench_env, header, parse_part_args, part_parser, table, write_json
from _setup import setup, write_section

DB = os.environ.get("ATLAS_BENCH_DB") or "atlas_bench_renderers"
TITLE = "API pages encoded by orjson"


def seed(keys: int) -> str:
    from changesets.models import Rpc
    from changesets.ops import PutOp
    from changesets.services.apply import changeset_apply
    from entities.models import Namespace
    from entities.store import EntityKey, baseline
    from tests.entities.factories import SuperuserFactory

    root = SuperuserFactory(username=f"bench-render-{uuid.uuid4().hex[:6]}")
    ns = f"bench.render{uuid.uuid4().hex[:6]}"
    Namespace.objects.create(name=ns)
    for n in range(3):
        ops = [
            PutOp(EntityKey(ns, "item", f"k{i:05d}"), {"title": f"item {n}", "price": n + i / 4})
            for i in range(keys)
        ]
        changeset_apply(store=baseline, actor=root, ops=ops, rpc=Rpc.BATCH_MUTATE)
    return ns


def measure(ns: str, repeat: int) -> dict[str, dict[str, Any]]:
    from django.contrib.auth.models import User
    from rest_framework import renderers
    from rest_framework.test import APIClient

    from atlas.api.renderers import JSONRenderer

    client = APIClient()
    client.force_authenticate(User.objects.filter(is_superuser=True).first())
    pages = {
        "entity list page (500 entities)": f"/api/v1/entities?namespace={ns}&page_size=500",
        "feed page (1,000 records)": f"/api/v1/changes?limit=1000&namespace={ns}",
        "changeset list page (100 changesets)": "/api/v1/changesets?page_size=100",
    }
    out: dict[str, dict[str, Any]] = {}
    for name, url in pages.items():
        response = client.get(url)
        assert response.status_code == 200, (url, response.status_code)
        data = response.data
        drf, ours = renderers.JSONRenderer(), JSONRenderer()
        times: dict[str, list[float]] = {"drf": [], "orjson": []}
        for _ in range(repeat):
            for label, renderer in (("drf", drf), ("orjson", ours)):
                started = time.perf_counter()
                renderer.render(data)
                times[label].append((time.perf_counter() - started) * 1000)
        out[name] = {
            "bytes": len(drf.render(data)),
            "same_bytes": drf.render(data) == ours.render(data),
            **{label: statistics.median(values) for label, values in times.items()},
        }
    return out


def main() -> None:
    parser = part_parser(__doc__)
    parser.add_argument("--repeat", type=int, default=30)
    args = parse_part_args(parser)
    keys, repeat = (50, 3) if args.smoke else (1000, args.repeat)
    bench_env()
    setup(database=DB)
    result = measure(seed(keys), repeat)
    write_json(args.json, {"keys": keys, "pages": result})
    rows = [
        [
            name,
            f"{r['bytes']:,}",
            f"{r['drf']:.2f}",
            f"{r['orjson']:.2f}",
            f"{r['drf'] / r['orjson']:.1f}×",
            "yes" if r["same_bytes"] else "**no**",
        ]
        for name, r in result.items()
    ]
    body = table(
        ["page", "bytes", "DRF's renderer, ms", "orjson, ms", "faster", "same bytes"], rows
    )
    print(body)
    write_section(
        TITLE,
        header("bench/renderers.py" + (" --smoke" if args.smoke else ""))
        + f"\nThe data of each page as its view returns it, rendered {repeat} times by each"
        " renderer, interleaved; medians.\n\n" + body,
    )


if __name__ == "__main__":
    main()
