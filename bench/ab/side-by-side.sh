#!/usr/bin/env bash
# Two verdict binaries side by side, for an A/B on a machine whose speed drifts between runs.
#
#   bench/ab/side-by-side.sh BIN_A BIN_B
#
# Starts both servers at once, each on its own fresh database (BACKEND: postgres, the default,
# or sqlite), with a tenant whose callback goes to one local nginx answering 204; then runs wrk
# against each in turn, ROUNDS (4) times, the order swapped every round (A B, B A, …), SECS (6)
# seconds a run at C (32) connections. MODE fresh (bench/wrk/new.lua) or replay
# (bench/wrk/replay.lua, its key sent once first). Prints each run's requests per second,
# the server's CPU per request (utime+stime of its process across the run), and wrk's p50 and
# p99. Beside ./scripts/bench, whose floors are what the targets are against: this compares two
# builds with the drift spread over both.
set -euo pipefail
cd "$(dirname "$0")/../.."

A=${1:?usage: side-by-side.sh BIN_A BIN_B} B=${2:?usage: side-by-side.sh BIN_A BIN_B}
C=${C:-32} SECS=${SECS:-6} ROUNDS=${ROUNDS:-4} MODE=${MODE:-fresh} BACKEND=${BACKEND:-postgres}
export PGHOST=${PGHOST:-127.0.0.1} PGPORT=${PGPORT:-5432} PGUSER=${PGUSER:-postgres}
case "$MODE" in fresh) script=bench/wrk/new.lua ;; replay) script=bench/wrk/replay.lua ;;
    *) echo "side-by-side: MODE is fresh or replay" >&2; exit 1 ;; esac
for tool in wrk nginx psql; do
    command -v "$tool" >/dev/null || { echo "side-by-side: $tool is missing (scripts/bench installs it)" >&2; exit 1; }
done

. bench/lib.sh

WORK=$(mktemp -d /tmp/verdict-ab.XXXXXX)
PIDS=() DBS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    for db in "${DBS[@]}"; do psql -q -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT

start_receiver "$WORK/nginx"
hook_port=$HOOK_PORT

export VERDICT_ALLOW_PRIVATE_DESTINATIONS=1 VERDICT_RATE_LIMIT_PER_TENANT=0
VERDICT_MASTER_KEY=$(python3 -c 'import base64, os; print(base64.b64encode(os.urandom(32)).decode())')
export VERDICT_MASTER_KEY
declare -A KEY BASE PID
for side in A B; do
    bin=${!side}
    [ -x "$bin" ] || { echo "side-by-side: no verdict binary at $bin" >&2; exit 1; }
    if [ "$BACKEND" = sqlite ]; then
        export VERDICT_DATABASE_URL="sqlite://$WORK/$side.db"
    else
        db=verdict_ab_${side,,}_$$
        DBS+=("$db")
        psql -q -d postgres -c "CREATE DATABASE $db"
        export VERDICT_DATABASE_URL="postgres://$PGUSER@$PGHOST:$PGPORT/$db"
    fi
    KEY[$side]=$("$bin" tenant create --name "ab-$side" --no-inbound-signature \
        --callback-url "http://127.0.0.1:$hook_port/" --json | json_field api_key)
    port=$(free_port)
    BASE[$side]="http://127.0.0.1:$port"
    env -u FAILPOINTS "$bin" serve --listen "127.0.0.1:$port" >"$WORK/serve-$side.log" 2>&1 &
    PID[$side]=$!
    PIDS+=($!)
    for _ in $(seq 1 100); do curl -fsS -o /dev/null "${BASE[$side]}/healthz" 2>/dev/null && break; sleep 0.1; done
    curl -fsS -o /dev/null "${BASE[$side]}/healthz" ||
        { echo "side-by-side: $bin did not start: $(tail -5 "$WORK/serve-$side.log")" >&2; exit 1; }
    if [ "$MODE" = replay ]; then
        # replay.lua's request, sent once so that every later one replays it.
        body=$(sed -n "s/^wrk.body = '\(.*\)'$/\1/p" "$script")
        key=$(sed -n 's/^wrk.headers\["Idempotency-Key"\] = "\(.*\)"$/\1/p' "$script")
        curl -fsS -o /dev/null -X POST "${BASE[$side]}/v1/signals" -H "Authorization: Bearer ${KEY[$side]}" \
            -H "Content-Type: application/json" -H "Idempotency-Key: $key" --data "$body"
    fi
done

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
run() { # run SIDE SECONDS PREFIX: prints "requests req/s p50 p99"
    # wrk wants no more threads than connections.
    wrk -t"$(( C < 2 ? C : 2 ))" -c"$C" -d"$2s" --timeout 30s --latency -s "$script" "${BASE[$1]}/v1/signals" -H "Authorization: Bearer ${KEY[$1]}" \
        -H "Content-Type: application/json" -- "$3-$$" "$(( ($(date +%s) + RANDOM) % 100000 ))" >"$WORK/wrk.out" 2>&1 ||
        { echo "side-by-side: wrk failed against $1: $(cat "$WORK/wrk.out")" >&2; exit 1; }
    grep -q 'Non-2xx' "$WORK/wrk.out" && { echo "side-by-side: $1 answered non-2xx: $(cat "$WORK/wrk.out")" >&2; exit 1; }
    echo "$(awk '/requests in/ {print $1}' "$WORK/wrk.out") $(awk '/Requests\/sec/ {print $2}' "$WORK/wrk.out")" \
        "$(awk '$1 == "50%" {print $2}' "$WORK/wrk.out") $(awk '$1 == "99%" {print $2}' "$WORK/wrk.out")"
}
for side in A B; do run "$side" 2 warm >/dev/null; done
hz=$(getconf CLK_TCK)
echo "side-by-side: $MODE on $BACKEND, c=$C, ${SECS}s a run; A=$A B=$B"
for round in $(seq 1 "$ROUNDS"); do
    order="A B"
    [ $((round % 2)) -eq 0 ] && order="B A"
    for side in $order; do
        before=$(cpu_ticks "${PID[$side]}")
        out=$(run "$side" "$SECS" "r$round")
        read -r requests rate p50 p99 <<<"$out"
        after=$(cpu_ticks "${PID[$side]}")
        printf '%s round %d: %10.0f req/s  cpu/req %.3f ms  p50 %s  p99 %s\n' "$side" "$round" "$rate" \
            "$(python3 -c "print(($after - $before) * 1000 / $hz / $requests)")" "$p50" "$p99"
    done
done
