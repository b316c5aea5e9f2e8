-- Appended by scripts/bench to a copy of each load script (the scripts themselves are unchanged
-- copies of ../shared/perf/wrk/). Counts the requests the script started and, when wrk is done,
-- prints one machine-readable line: completed requests, errors by kind, latency percentiles and
-- the mean latency (what scripts/bench sets the server's per-phase means beside).
-- `started` minus `requests` is what was still in flight when wrk's duration ran out.
local bench_threads = {}
local script_setup = setup
setup = function(thread)
  table.insert(bench_threads, thread)
  if script_setup then script_setup(thread) end
end
bench_started = 0
if request then
  local script_request = request
  request = function()
    bench_started = bench_started + 1
    return script_request()
  end
end
done = function(summary, latency, requests)
  local started = 0
  for _, thread in ipairs(bench_threads) do
    started = started + (thread:get("bench_started") or 0)
  end
  local e = summary.errors
  io.write(string.format(
    "BENCH requests=%d duration_us=%d non2xx=%d connect=%d read=%d write=%d timeout=%d p50_us=%d p99_us=%d mean_us=%d started=%d\n",
    summary.requests, summary.duration, e.status, e.connect, e.read, e.write, e.timeout,
    latency:percentile(50), latency:percentile(99), latency.mean, started))
end
