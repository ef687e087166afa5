"""A time becomes a seq boundary by binary search on the seq index; ``changeset_at_seq`` goes.

``at`` never runs backwards in seq order: the log statement draws it with
``GREATEST`` under the log head's lock (``changesets.services.log_statement``).
So "the changesets at or before T" is a prefix of the log, and its end can be
found by bisecting seq, each step one probe of the seq index
(``changesets_changeset_seq_key``) and its row: about 24 probes at 10M
changesets, a fraction of a millisecond. The index on ``(at, seq)`` that
answered it in one seek cost about 32 bytes and one index insert on every
write (issue 16, "half the bytes"; issue 17, the single write).

``atlas_seq_bound(t, upper)``: with ``upper``, the highest seq whose ``at`` is
at or before ``t``; without, the lowest seq whose ``at`` is at or after ``t``;
NULL when there is none. Gaps in seq (an archive cut's removal) cost nothing:
each probe takes the first seq at or above its midpoint.
(``changesets.selectors.log.seq_upto`` and ``seq_from`` call it.)
"""

from django.db import migrations

FUNCTION = """
CREATE OR REPLACE FUNCTION atlas_seq_bound(t timestamptz, upper boolean) RETURNS bigint
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
DECLARE
    lo bigint;
    hi bigint;
    mid bigint;
    s bigint;
    a timestamptz;
    first_past bigint;
BEGIN
    SELECT seq INTO lo FROM changesets_changeset ORDER BY seq LIMIT 1;
    SELECT seq INTO hi FROM changesets_changeset ORDER BY seq DESC LIMIT 1;
    IF lo IS NULL THEN
        RETURN NULL;
    END IF;
    -- The lowest value v in [lo, hi + 1] whose first seq at or above v is "past"
    -- t (upper: at > t; lower: at >= t); hi + 1 stands for "none is". Past is
    -- monotone in seq because at is, so it is monotone in v: bisect.
    hi := hi + 1;
    WHILE lo < hi LOOP
        mid := lo + (hi - lo) / 2;
        SELECT seq, at INTO s, a FROM changesets_changeset WHERE seq >= mid ORDER BY seq LIMIT 1;
        IF (upper AND a > t) OR (NOT upper AND a >= t) THEN
            hi := mid;
        ELSE
            lo := s + 1;  -- every v in (mid, s] has the same first seq, s
        END IF;
    END LOOP;
    SELECT seq INTO first_past FROM changesets_changeset WHERE seq >= lo ORDER BY seq LIMIT 1;
    IF NOT upper THEN
        RETURN first_past;
    END IF;
    IF first_past IS NULL THEN
        RETURN (SELECT max(seq) FROM changesets_changeset);
    END IF;
    RETURN (SELECT max(seq) FROM changesets_changeset WHERE seq < first_past);
END
$$;
"""


class Migration(migrations.Migration):
    dependencies = [("changesets", "0031_revision_key_by_seq")]

    operations = [
        migrations.RunSQL(FUNCTION, "DROP FUNCTION IF EXISTS atlas_seq_bound(timestamptz, boolean)"),
        migrations.RemoveIndex(model_name="changeset", name="changeset_at_seq"),
    ]
