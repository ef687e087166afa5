#!/bin/sh
# Run once by the postgres image when it initializes the primary's data folder
# (docker-compose.yml mounts it into /docker-entrypoint-initdb.d): a role the replica
# streams with, and the pg_hba line that lets it (the image's own lines do not cover
# replication connections).
set -eu
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" <<SQL
CREATE ROLE replicator WITH REPLICATION LOGIN PASSWORD '${REPLICATION_PASSWORD:-replicator}';
SQL
echo "host replication replicator all scram-sha-256" >> "$PGDATA/pg_hba.conf"
