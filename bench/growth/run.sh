# The growth scenarios, sourced by scripts/bench (it uses that script's wrk_run, record, log, die,
# launch_server, check_stored, json_field, cpu_ticks, per_request, wal_lsn and its WORK, BIN,
# CALLBACK_URL, PIDS, PG_DBS).
#
# Two PostgreSQL databases, each with one tenant whose callback goes to the bench's nginx:
#   empty  nothing but the tenant;
#   grown  GROWTH_ROWS live signals (key, event and callback delivery each, spread over the
#          90-day retention window, keys unexpired) plus GROWTH_BACKLOG older ones past
#          retention with expired keys (bench/growth/seed.sql).
# A server is started on a database just before each run (VERDICT_PRUNE_INTERVAL_SECS=1, so its
# pruner starts with the run) and stopped after it; empty and grown runs alternate. Both
# scenarios record the empty database as side `floor` and the grown one as `verdict`, so the
# table's ratio is grown / empty.
#   growth     catch-up: the grown database's pruner works off the seeded backlog as fast as it
#              can while fresh signals arrive. Written to $GROWTH_OUT beside each run: the
#              events it deleted (pg_stat_user_tables n_tup_del, read after the server exits
#              and its backends have flushed their counts) per second of the server's life,
#              against the run's ingest rate; the longest pruning batch the server logged
#              (`longest_batch_ms`), against the run's p99.
#   growth/1x  steady state: what is left of the backlog is pruned first (`verdict prune`,
#              timed: the idle rate), then before each run as many of the oldest live signals
#              as the last empty run stored in its time are moved past retention, so the
#              pruner deletes what ingest adds, as it does once a database is full.
# WAL per signal stored: the grown side's includes what its pruner wrote meanwhile.

GROWTH_OUT=$WORK/growth.tsv
: >"$GROWTH_OUT"

# growth_db NAME: a database with the bench tenant; sets GROWTH_URL and GROWTH_KEY.
growth_db() {
    psql -q -d postgres -c "CREATE DATABASE $1" >/dev/null
    PG_DBS+=("$1")
    GROWTH_URL="postgres://$PGUSER@$PGHOST:$PGPORT/$1"
    GROWTH_KEY=$(VERDICT_DATABASE_URL=$GROWTH_URL VERDICT_MASTER_KEY=$MASTER_KEY VERDICT_ALLOW_PRIVATE_DESTINATIONS=1 \
        "$BIN" tenant create --name bench-growth --no-inbound-signature --callback-url "$CALLBACK_URL" --json |
        json_field api_key)
}

# growth_serve URL LOG: starts a server on database URL, its pruner ticking every second; sets
# GROWTH_PID and GROWTH_BASE.
growth_serve() {
    launch_server "$1" "$2" VERDICT_PRUNE_INTERVAL_SECS=1
    GROWTH_PID=$LAUNCHED_PID GROWTH_BASE=$LAUNCHED_BASE
}

# n_tup DB: "inserted deleted" rows of events, as the statistics collector counts them.
events_tup() {
    psql -qtA -F' ' -d "$1" -c "SELECT n_tup_ins, n_tup_del FROM pg_stat_user_tables WHERE relname = 'events'"
}

# growth_run SCENARIO SIDE ROUND: one fresh run on the empty (floor) or grown (verdict) database.
growth_run() {
    local scenario=$1 side=$2 round=$3 db url key
    if [ "$side" = floor ]; then db=$GROWTH_EMPTY url=$GROWTH_EMPTY_URL key=$GROWTH_EMPTY_KEY
    else db=$GROWTH_GROWN url=$GROWTH_GROWN_URL key=$GROWTH_GROWN_KEY; fi
    [ "$scenario/$side" = growth/1x/verdict ] && past_retention "$GROWTH_LAST_EMPTY_STORED"
    local ins0 del0 ins1 del1 started ended log=$WORK/growth-${scenario//\//-}-$side-$round.log
    local before_cpu after_cpu lsn0 wal
    read -r ins0 del0 <<<"$(events_tup "$db")"
    lsn0=$(wal_lsn)
    started=$(date +%s%N)
    growth_serve "$url" "$log"
    before_cpu=$(cpu_ticks "$GROWTH_PID")
    RUN_SEQ=$((RUN_SEQ + 1))
    API_KEY=$key wrk_run new.lua "$GROWTH_BASE" "bench-g-$(date +%s%N)-$round" "$RUN_SEQ"
    after_cpu=$(cpu_ticks "$GROWTH_PID")
    sleep 0.5 # requests abandoned when wrk's time ran out
    kill "$GROWTH_PID"
    wait "$GROWTH_PID" 2>/dev/null || true
    ended=$(date +%s%N)
    wal=$(psql -qtA -d postgres -c "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '$lsn0')")
    sleep 1 # the server's backends flush their counts as they exit
    read -r ins1 del1 <<<"$(events_tup "$db")"
    local added=$((ins1 - ins0))
    check_stored "$scenario $side round $round" "$added"
    [ "$side" = floor ] && GROWTH_LAST_EMPTY_STORED=$added
    record postgres "$scenario" "$side" "$round" "$BENCH_requests" "$BENCH_rps" "$BENCH_p50" "$BENCH_p99" \
        "$(per_request $((after_cpu - before_cpu)) "$BENCH_requests")" \
        "$(awk -v w="$wal" -v n="$added" 'BEGIN { printf "%.0f", w / n }')" -
    [ "$side" = verdict ] || return 0
    local pruned=$((del1 - del0)) longest left
    longest=$(grep -o 'longest_batch_ms=[0-9]*' "$log" | cut -d= -f2 | sort -n | tail -1)
    left=$(psql -qtA -d "$db" -c "SELECT count(*) FROM (SELECT 1 FROM events WHERE created_at < \
        (extract(epoch FROM now()) * 1000)::bigint - 90 * 86400000::bigint LIMIT 1) o")
    # scenario, round, events pruned, seconds the server ran, ingest/s, longest batch ms, p99
    # ms, whether past-retention events were left when it stopped (if not, the rate is a floor).
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$scenario" "$round" "$pruned" \
        "$(awk -v ns=$((ended - started)) 'BEGIN { printf "%.2f", ns / 1e9 }')" "$BENCH_rps" \
        "${longest:-0}" "$BENCH_p99" "$left" >>"$GROWTH_OUT"
    log "$scenario round $round: pruned $pruned events in $(((ended - started) / 1000000)) ms beside $BENCH_rps signals/s; longest batch ${longest:-0} ms, p99 $BENCH_p99 ms"
    # Without pruning the grown side is not the scenario: refuse the run rather than print it.
    [ "$pruned" -gt 0 ] || die "$scenario round $round: the grown database's pruner deleted nothing"
}

# past_retention N: moves the N oldest live signals of the grown database past retention (their
# events a second past the 90 days, their keys expired just now), as time would: ahead of where
# the pruner's saved sweep got to, which is where time moves rows past retention.
past_retention() {
    psql -q -d "$GROWTH_GROWN" -v n="$1" >/dev/null <<'SQL'
\set ON_ERROR_STOP on
UPDATE events SET created_at = (extract(epoch FROM now()) * 1000)::bigint - 90 * 86400000::bigint - 1000
WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM events ORDER BY created_at LIMIT :n));
UPDATE idempotency_keys SET expires_at = (extract(epoch FROM now()) * 1000)::bigint - 1
WHERE ctid = ANY (ARRAY(
    SELECT ctid FROM idempotency_keys WHERE expires_at > (extract(epoch FROM now()) * 1000)::bigint
    LIMIT :n));
CHECKPOINT;
SQL
}

MASTER_KEY=$(python3 -c 'import base64, os; print(base64.b64encode(os.urandom(32)).decode())')
GROWTH_EMPTY=verdict_bench_$$_empty
GROWTH_GROWN=verdict_bench_$$_grown
growth_db "$GROWTH_EMPTY"
GROWTH_EMPTY_URL=$GROWTH_URL GROWTH_EMPTY_KEY=$GROWTH_KEY
growth_db "$GROWTH_GROWN"
GROWTH_GROWN_URL=$GROWTH_URL GROWTH_GROWN_KEY=$GROWTH_KEY

# One signal through the grown database's server: the row shapes the seed copies.
growth_serve "$GROWTH_GROWN_URL" "$WORK/growth-template.log"
status=$(curl -sS -o "$WORK/growth-first.json" -w '%{http_code}' -X POST "$GROWTH_BASE/v1/signals" \
    -H "Authorization: Bearer $GROWTH_GROWN_KEY" -H "Content-Type: application/json" -H "Idempotency-Key: growth-template" \
    --data '{"type":"sim_swap","subject":{"phone":"+447700900998"},"observed_at":"2026-11-30T09:00:00Z"}')
[ "$status" = 200 ] || die "growth: the template signal was refused ($status): $(cat "$WORK/growth-first.json")"
sleep 0.5
kill "$GROWTH_PID"
wait "$GROWTH_PID" 2>/dev/null || true
log "growth: seeding $GROWTH_ROWS live signals and $GROWTH_BACKLOG past retention (bench/growth/seed.sql)"
seed_started=$(date +%s)
psql -q -d "$GROWTH_GROWN" -v live="$GROWTH_ROWS" -v old="$GROWTH_BACKLOG" -f bench/growth/seed.sql >/dev/null
log "growth: seeded in $(($(date +%s) - seed_started)) s; $(psql -qtA -d "$GROWTH_GROWN" -c \
    "SELECT pg_size_pretty(pg_database_size(current_database()))")"
psql -q -d postgres -c CHECKPOINT >/dev/null

for round in $(seq 1 "$ROUNDS"); do
    if [ $((round % 2)) = 1 ]; then growth_run growth floor "$round"; growth_run growth verdict "$round"
    else growth_run growth verdict "$round"; growth_run growth floor "$round"; fi
done
prune_started=$(date +%s%N)
pruned=$(VERDICT_DATABASE_URL=$GROWTH_GROWN_URL VERDICT_MASTER_KEY=$MASTER_KEY "$BIN" prune)
prune_ms=$((($(date +%s%N) - prune_started) / 1000000))
GROWTH_IDLE_PRUNE=$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["events"])' "$pruned")
log "growth: the rest of the backlog, $GROWTH_IDLE_PRUNE events, pruned idle in $prune_ms ms: $pruned"
echo "$GROWTH_IDLE_PRUNE $prune_ms" >"$WORK/growth-idle.txt"
psql -q -d postgres -c CHECKPOINT >/dev/null
for round in $(seq 1 "$ROUNDS"); do
    # The empty run first: the grown one moves as many signals past retention as it stored.
    growth_run growth/1x floor "$round"
    growth_run growth/1x verdict "$round"
done
