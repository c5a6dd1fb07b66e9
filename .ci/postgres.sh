#!/usr/bin/env bash
# Install (if needed) and start a local PostgreSQL server for the database tests, create the
# role and database they use, and print the SQLAlchemy URL on stdout (all else goes to stderr).
#
#   export TUNER_TEST_POSTGRES_URL="$(bash .ci/postgres.sh)"
#
# Idempotent: a server that already runs and a role/database that already exist are reused.
# Meant for root in a Debian/Ubuntu machine or container (CI); it uses the distribution's
# cluster tools (pg_lsclusters, pg_createcluster, pg_ctlcluster). Set PYTHON=path/to/python to
# also install the psycopg driver into that environment.
set -euo pipefail

DB_NAME="${TUNER_PG_DB:-tuner_test}"
DB_USER="${TUNER_PG_USER:-tuner}"
DB_PASSWORD="${TUNER_PG_PASSWORD:-tuner}"

log() { echo "postgres.sh: $*" >&2; }

if [ "$(id -u)" -ne 0 ]; then
    log "must run as root (it installs packages and starts the server as user postgres)"
    exit 1
fi

if ! command -v pg_lsclusters >/dev/null 2>&1 || [ -z "$(ls /usr/lib/postgresql 2>/dev/null)" ]; then
    log "installing postgresql with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq postgresql >&2
fi

VERSION="$(ls /usr/lib/postgresql | sort -V | tail -n 1)"
# Columns of `pg_lsclusters -h`: version, cluster, port, status, owner, data dir, log file.
cluster_field() { pg_lsclusters -h | awk -v v="$VERSION" -v f="$1" '$1 == v && $2 == "main" {print $f}'; }
if [ -z "$(cluster_field 2)" ]; then
    log "creating cluster $VERSION/main"
    pg_createcluster "$VERSION" main >&2
fi
if [ "$(cluster_field 4)" != "online" ]; then
    log "starting cluster $VERSION/main"
    pg_ctlcluster "$VERSION" main start >&2
fi
PORT="$(cluster_field 3)"

psql_admin() { (cd / && runuser -u postgres -- psql -p "$PORT" -v ON_ERROR_STOP=1 -qtA "$@"); }

for _ in $(seq 1 30); do
    psql_admin -c "SELECT 1" >/dev/null 2>&1 && break
    sleep 1
done
psql_admin -c "SELECT 1" >/dev/null || { log "server on port $PORT does not answer"; exit 1; }

if [ "$(psql_admin -c "SELECT 1 FROM pg_roles WHERE rolname = '$DB_USER'")" != "1" ]; then
    log "creating role $DB_USER"
    psql_admin -c "CREATE ROLE \"$DB_USER\" LOGIN PASSWORD '$DB_PASSWORD'"
fi
if [ "$(psql_admin -c "SELECT 1 FROM pg_database WHERE datname = '$DB_NAME'")" != "1" ]; then
    log "creating database $DB_NAME"
    psql_admin -c "CREATE DATABASE \"$DB_NAME\" OWNER \"$DB_USER\""
fi

if [ -n "${PYTHON:-}" ] && ! "$PYTHON" -c "import psycopg" >/dev/null 2>&1; then
    log "installing psycopg[binary] into $PYTHON"
    "$PYTHON" -m pip install --quiet "psycopg[binary]" >&2
fi

echo "postgresql+psycopg://$DB_USER:$DB_PASSWORD@127.0.0.1:$PORT/$DB_NAME"
