#!/usr/bin/env bash
# Runs a command against a PostgreSQL cluster of its own, configured for a database of tens of
# millions of signals as docs/design.md ("What size costs") recommends: shared buffers that hold
# the hash-keyed indexes, checkpoints far enough apart that a leaf is logged whole once per
# checkpoint rather than once per few thousand signals, and compressed page images. The shared
# cluster keeps PostgreSQL's defaults (128 MB of buffers, a checkpoint every 1 GB of WAL), which
# suit the empty database the other scenarios use; this shows what the grown one costs where it
# is set up for its size. Both sides of the growth scenarios (empty and grown) run on it.
#
#   bench/growth/sized-cluster.sh env SCENARIOS=growth BACKENDS=postgres ./scripts/bench
#
# SIZED_PORT (5499), SIZED_SHARED_BUFFERS (a quarter of the machine's memory),
# SIZED_MAX_WAL_SIZE (16GB), SIZED_CHECKPOINT_TIMEOUT (15min), SIZED_DIR (a new directory under
# /var/tmp; the grown database takes about 35 GB there while it lives). The cluster and its
# directory are removed when the command ends.
set -euo pipefail

pg_bin=$(find /usr/lib/postgresql -maxdepth 2 -name bin -type d | sort -V | tail -1)
[ -x "$pg_bin/initdb" ] || { echo "sized-cluster: no PostgreSQL server binaries under /usr/lib/postgresql" >&2; exit 1; }
[ "$#" -gt 0 ] || { echo "usage: $0 COMMAND [ARGS...]" >&2; exit 2; }

port=${SIZED_PORT:-5499}
mem_kb=$(awk '/^MemTotal:/ { print $2 }' /proc/meminfo)
shared_buffers=${SIZED_SHARED_BUFFERS:-$((mem_kb / 4 / 1024))MB}
dir=${SIZED_DIR:-$(mktemp -d /var/tmp/verdict-sized.XXXXXX)}

# The server refuses to run as root: as root, run it as postgres.
as_pg() {
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}
[ "$(id -u)" = 0 ] && chown postgres "$dir"

stop() {
    as_pg "$pg_bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1 || true
    rm -rf "$dir"
}
trap stop EXIT

as_pg "$pg_bin/initdb" -D "$dir/data" -A trust -U postgres >/dev/null
cat >>"$dir/data/postgresql.conf" <<EOF
port = $port
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
max_connections = 200
shared_buffers = $shared_buffers
max_wal_size = ${SIZED_MAX_WAL_SIZE:-16GB}
checkpoint_timeout = ${SIZED_CHECKPOINT_TIMEOUT:-15min}
wal_compression = lz4
EOF
as_pg "$pg_bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w start >/dev/null
echo "sized-cluster: PostgreSQL on 127.0.0.1:$port, shared_buffers $shared_buffers," \
    "max_wal_size ${SIZED_MAX_WAL_SIZE:-16GB}, checkpoint_timeout ${SIZED_CHECKPOINT_TIMEOUT:-15min}," \
    "wal_compression lz4" >&2

PGHOST=127.0.0.1 PGPORT=$port PGUSER=postgres "$@"
