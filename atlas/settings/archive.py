"""Archives and retention: the signing key, where segments go, the cut's sizes and
grace, the revision table's partition width, and how long history stays hot
(docs/retention.md). The storage itself is ``STORAGES["atlas_archive"]``
(``base``); the retention and partition upkeep intervals are beat's (``celery``).
"""

from __future__ import annotations

import os

from atlas.settings.env import env_float, env_int

ATLAS_ARCHIVE_SIGNING_KEY = os.environ.get("ATLAS_ARCHIVE_SIGNING_KEY", "")
ATLAS_ARCHIVE_LOCATION = os.environ.get("ATLAS_ARCHIVE_LOCATION", "")
ATLAS_ARCHIVE_SEGMENT_REVISIONS = env_int("ATLAS_ARCHIVE_SEGMENT_REVISIONS", 100_000)
ATLAS_ARCHIVE_DELETE_BATCH = env_int("ATLAS_ARCHIVE_DELETE_BATCH", 2_000)
ATLAS_ARCHIVE_GRACE_SECONDS = env_float("ATLAS_ARCHIVE_GRACE_SECONDS", 10)
ATLAS_ARCHIVE_CUT_CACHE_SECONDS = env_float("ATLAS_ARCHIVE_CUT_CACHE_SECONDS", 2)
# The revision table's range partitions (changesets.partitions): seqs per partition, and
# how many partitions upkeep keeps ready past the log head.
ATLAS_LOG_PARTITION_SEQS = env_int("ATLAS_LOG_PARTITION_SEQS", 1_000_000)
ATLAS_LOG_PARTITIONS_AHEAD = env_int("ATLAS_LOG_PARTITIONS_AHEAD", 2)
ATLAS_RETENTION_DAYS = env_int("ATLAS_RETENTION_DAYS", 0)
