-- wrk script: POST pre-built (pre-signed) requests, read from a file given after "--".
-- File format, one request per line, tab-separated: path, then header=value fields, then the body
-- (compact JSON: it has no tab or newline). Each wrk thread takes every n-th line (no two threads send
-- the same request) and goes round its share. done() prints one line: "WRK_JSON {...}".

local threads = {}
local counter = 0

function setup(thread)
  thread:set("id", counter)
  counter = counter + 1
  table.insert(threads, thread)
end

function init(args)
  local file = assert(io.open(args[1], "r"))
  local total = tonumber(args[2]) or 1
  requests = {}
  local n = 0
  for line in file:lines() do
    if n % total == id then
      local fields = {}
      for field in string.gmatch(line, "[^\t]+") do
        table.insert(fields, field)
      end
      local headers = {}
      for i = 2, #fields - 1 do
        local name, value = string.match(fields[i], "^([^=]+)=(.*)$")
        headers[name] = value
      end
      table.insert(requests, wrk.format("POST", fields[1], headers, fields[#fields]))
    end
    n = n + 1
  end
  file:close()
  position = 0
end

function request()
  position = position + 1
  if position > #requests then
    position = 1
  end
  return requests[position]
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRK_JSON {"requests": %d, "duration_us": %d, "connect_errors": %d, "read_errors": %d, ' ..
    '"write_errors": %d, "status_errors": %d, "timeouts": %d, "p50_us": %d, "p90_us": %d, ' ..
    '"p99_us": %d, "max_us": %d}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
end
