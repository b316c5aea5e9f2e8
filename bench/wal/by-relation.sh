#!/usr/bin/env bash
# Where a fresh signal's WAL goes, relation by relation (PostgreSQL, pg_walinspect).
#
#   bench/wal/by-relation.sh [VERDICT_BIN]    # default: target/release/verdict
#
# On a fresh database, with a tenant whose callback goes to a local nginx answering 204 and one
# with no callback: for each, a warm-up run, a CHECKPOINT (so every page's first change after it
# is a full-page image, as in steady state right after a checkpoint), then SECS (4) seconds of
# fresh signals at C (8) connections with wrk (bench/wrk/new.lua). Prints the WAL bytes per
# signal stored, then the records between the two WAL positions grouped by relation and record
# type, per signal: records, bytes (full-page images included) and the full-page images alone.
# SIGNAL_TYPE (default sim_swap: new.lua's, rewritten in a copy) measures another rule of the
# default playbook: credential_breach is its step-up (alert_customer, charge_step_up, callback).
# SEED (a SQL file, its path from the repository's root, run with psql -v rows=SEED_ROWS,
# default 1,000,000, once the tenants exist) grows the database first, e.g.
# bench/wal/seed-ledger.sql. GROW (a count) grows it instead as the growth scenario does: after
# the first warm-up, bench/growth/seed.sql copies one of its signals GROW times over the 90-day
# window (no backlog), so the measured runs write into indexes of that size.
# A diagnostic beside ./scripts/bench, whose WAL column measures the same total.
set -euo pipefail
cd "$(dirname "$0")/../.."

BIN=${1:-target/release/verdict}
SECS=${SECS:-4} C=${C:-8}
SIGNAL_TYPE=${SIGNAL_TYPE:-sim_swap} SEED_ROWS=${SEED_ROWS:-1000000}
export PGHOST=${PGHOST:-127.0.0.1} PGPORT=${PGPORT:-5432} PGUSER=${PGUSER:-postgres}
[ -x "$BIN" ] || { echo "by-relation: no verdict binary at $BIN (cargo build --release)" >&2; exit 1; }
for tool in wrk nginx psql; do
    command -v "$tool" >/dev/null || { echo "by-relation: $tool is missing (scripts/bench installs it)" >&2; exit 1; }
done

. bench/lib.sh

WORK=$(mktemp -d /tmp/verdict-wal.XXXXXX)
sed "s/\"type\":\"sim_swap\"/\"type\":\"$SIGNAL_TYPE\"/" bench/wrk/new.lua >"$WORK/new.lua"
grep -q "\"type\":\"$SIGNAL_TYPE\"" "$WORK/new.lua" ||
    { echo "by-relation: bench/wrk/new.lua no longer names sim_swap where SIGNAL_TYPE goes" >&2; exit 1; }
DB=verdict_wal_$$
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    psql -q -d postgres -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT
psql -q -d postgres -c "CREATE DATABASE $DB"
psql -q -d "$DB" -c "CREATE EXTENSION pg_walinspect"
sql() { psql -qtA -d "$DB" -c "$1"; }

start_receiver "$WORK/nginx"
hook_port=$HOOK_PORT

export VERDICT_DATABASE_URL="postgres://$PGUSER@$PGHOST:$PGPORT/$DB" VERDICT_ALLOW_PRIVATE_DESTINATIONS=1 \
    VERDICT_RATE_LIMIT_PER_TENANT=0
VERDICT_MASTER_KEY=$(python3 -c 'import base64, os; print(base64.b64encode(os.urandom(32)).decode())')
export VERDICT_MASTER_KEY
with_callback=$("$BIN" tenant create --name wal-callback --no-inbound-signature \
    --callback-url "http://127.0.0.1:$hook_port/" --json | json_field api_key)
no_callback=$("$BIN" tenant create --name wal-nocallback --no-inbound-signature --json | json_field api_key)
if [ -n "${SEED:-}" ]; then
    echo "== seeding with $SEED (rows=$SEED_ROWS)"
    psql -X -q -v ON_ERROR_STOP=1 -d "$DB" -v rows="$SEED_ROWS" -f "$SEED" >/dev/null
fi

port=$(free_port)
base="http://127.0.0.1:$port"
env -u FAILPOINTS "$BIN" serve --listen "127.0.0.1:$port" >"$WORK/serve.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 100); do curl -fsS -o /dev/null "$base/healthz" 2>/dev/null && break; sleep 0.1; done
curl -fsS -o /dev/null "$base/healthz" || { echo "by-relation: verdict did not start: $(tail -5 "$WORK/serve.log")" >&2; exit 1; }

load() { # load API_KEY SECONDS PREFIX
    wrk -t2 -c"$C" -d"$2s" --timeout 30s -s "$WORK/new.lua" "$base" -H "Authorization: Bearer $1" \
        -H "Content-Type: application/json" -- "$3-$$" "$(( ($(date +%s) + RANDOM) % 100000 ))" |
        grep -E 'Requests/sec|Non-2xx' || true
}

for scenario in callback nocallback; do
    key=$with_callback
    [ "$scenario" = nocallback ] && key=$no_callback
    load "$key" 2 "warm-$scenario" >/dev/null
    if [ -n "${GROW:-}" ] && [ "$scenario" = callback ]; then
        echo "== growing with bench/growth/seed.sql (live=$GROW)"
        psql -X -q -v ON_ERROR_STOP=1 -d "$DB" -v live="$GROW" -v old=0 -f bench/growth/seed.sql >/dev/null
        load "$key" 2 "warm-grown-$scenario" >/dev/null
    fi
    sleep 1
    sql CHECKPOINT >/dev/null
    n0=$(sql 'SELECT COUNT(*) FROM events') lsn0=$(sql 'SELECT pg_current_wal_lsn()')
    echo "== $scenario: c=$C, ${SECS}s"
    load "$key" "$SECS" "run-$scenario"
    sleep 1 # the inline attempts' records, after the responses
    lsn1=$(sql 'SELECT pg_current_wal_lsn()') n1=$(sql 'SELECT COUNT(*) FROM events')
    n=$((n1 - n0))
    [ "$n" -gt 0 ] || { echo "by-relation: no signal was stored" >&2; exit 1; }
    echo "$n signals stored; WAL per signal: $(sql "SELECT round(pg_wal_lsn_diff('$lsn1', '$lsn0') / $n)") B"
    psql -q -d "$DB" -P pager=off -v n="$n" -v lsn0="$lsn0" -v lsn1="$lsn1" <<'SQL'
SELECT coalesce(c.relname, r.relfilenode::text, '-') AS relation, r.resource_manager AS rm,
    split_part(r.record_type, ' ', 1) AS record, round(count(*)::numeric / :n, 2) AS per_signal,
    round(sum(r.record_length)::numeric / :n) AS bytes, round(sum(r.fpi_length)::numeric / :n) AS fpi
FROM (SELECT *, (regexp_match(block_ref, 'rel \d+/\d+/(\d+)'))[1]::oid AS relfilenode
      FROM pg_get_wal_records_info(:'lsn0', :'lsn1')) r
LEFT JOIN pg_class c ON c.relfilenode = r.relfilenode
GROUP BY 1, 2, 3 ORDER BY bytes DESC LIMIT 30;
SQL
done
