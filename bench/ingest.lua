-- wrk script for bench/ingest: replays pre-signed deliveries and logs what was acknowledged.
--
-- wrk -s bench/ingest.lua URL -- REQUESTS PATH DUP_FRACTION ACK_LOG BODY_TEMPLATE
--   REQUESTS..N   one file per thread N: lines "message_id<TAB>timestamp<TAB>signature"
--   DUP_FRACTION  chance that a request repeats one this thread sent before (0 or 0.5)
--   ACK_LOG..N    per thread: the body of each 2xx answer, a line each
--   BODY_TEMPLATE the body, with {id} where the message id goes (as the signer saw it)
-- done() prints one line "BENCH_RESULT {json}" with wrk's totals, latency, our counters and
-- wrk's own CPU while it loaded the server (cpu_us).

local threads = {}
local thread_count = 0

function setup(thread)
  thread:set("tid", thread_count)
  thread_count = thread_count + 1
  table.insert(threads, thread)
end

function init(args)
  local prefix, path = args[1], args[2]
  dup = tonumber(args[3])
  local template = io.open(args[5]):read("*a")
  local head, tail = template:match("^(.-){id}(.*)$")
  reqs = {}
  for line in io.lines(prefix .. tid) do
    local id, ts, sig = line:match("^([^\t]+)\t([^\t]+)\t([^\t]+)$")
    reqs[#reqs + 1] = wrk.format("POST", path, {
      ["Content-Type"] = "application/json",
      ["X-Message-Id"] = id,
      ["webhook-id"] = id,
      ["webhook-timestamp"] = ts,
      ["webhook-signature"] = sig,
    }, head .. id .. tail)
  end
  ack_log = io.open(args[4] .. tid, "w")
  ack_log:setvbuf("full", 1048576)
  next_new, wrapped, acked, non_2xx = 1, 0, 0, 0
  math.randomseed(1000 + tid)
  -- wrk's CPU so far (os.clock is the whole process's, every thread's): done() counts from
  -- the later thread's end of init, so reading the requests in is not the load's cost.
  init_cpu = os.clock()
end

function request()
  if dup > 0 and next_new > 1 and math.random() < dup then
    return reqs[math.random(math.min(next_new - 1, #reqs))]
  end
  if next_new > #reqs then
    -- Out of fresh requests: ids repeat from here on, so the run is reported as invalid.
    wrapped = wrapped + 1
    return reqs[(wrapped - 1) % #reqs + 1]
  end
  next_new = next_new + 1
  return reqs[next_new - 1]
end

function response(status, headers, body)
  if status < 200 or status > 299 then
    non_2xx = non_2xx + 1
    return
  end
  acked = acked + 1
  -- The body as it came, parsed after the cell (bench/load.py): matching it here took wrk's
  -- time in every round trip of a server that waits on them (docs/benchmarks.md, "What holds
  -- ingest at 32 connections").
  ack_log:write(body, "\n")
end

function done(summary, latency, requests)
  local totals = { acked = 0, non_2xx = 0, wrapped = 0 }
  local loaded_from = 0
  for _, thread in ipairs(threads) do
    for name, _ in pairs(totals) do
      totals[name] = totals[name] + thread:get(name)
    end
    loaded_from = math.max(loaded_from, thread:get("init_cpu"))
  end
  local e = summary.errors
  io.write(string.format(
    'BENCH_RESULT {"requests":%d,"duration_us":%d,"connect_errors":%d,"read_errors":%d,' ..
    '"write_errors":%d,"timeouts":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,"max_us":%d,' ..
    '"acked":%d,"non_2xx":%d,"wrapped":%d,"cpu_us":%d}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max,
    totals.acked, totals.non_2xx, totals.wrapped, math.floor((os.clock() - loaded_from) * 1e6)))
end
