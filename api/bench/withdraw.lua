-- wrk script for `cargo run --release -p api --example http_bench`: every request is a
-- withdrawal of 1 with its own pre-issued ticket. The bench writes the tickets to a file,
-- one "<account id> <api key> <ticket id>" per line; thread i of n takes lines i, i+n, ...
-- Counts answers by status, so only 201s count as withdrawals.

local threads = {}
local counter = 0

function setup(thread)
  thread:set("index", counter)
  counter = counter + 1
  thread:set("count", 0)
  table.insert(threads, thread)
end

function init(args)
  local path, stride = args[1], tonumber(args[2])
  -- "wrap": start the list over when it runs out (replays of used tickets).
  wrap = args[3] == "wrap"
  tickets = {}
  local line_number = 0
  for line in io.lines(path) do
    if line_number % stride == index then
      local account, key, ticket = line:match("(%S+) (%S+) (%S+)")
      table.insert(tickets, { account = account, key = key, ticket = ticket })
    end
    line_number = line_number + 1
  end
  next_ticket = 1
  created, other = 0, 0
end

function request()
  if wrap and next_ticket > #tickets then
    next_ticket = 1
  end
  local t = tickets[next_ticket]
  if t == nil then
    -- Ran out: ask for something cheap that will not count as a withdrawal.
    return wrk.format("GET", "/healthz")
  end
  next_ticket = next_ticket + 1
  return wrk.format("POST", "/v1/accounts/" .. t.account .. "/withdrawals", {
    ["Authorization"] = "Bearer " .. t.key,
    ["Idempotency-Key"] = t.ticket,
    ["Content-Type"] = "application/json",
  }, '{"amount":1}')
end

function response(status, headers, body)
  if status == 201 then
    created = created + 1
  else
    other = other + 1
  end
end

function done(summary, latency, requests)
  local total_created, total_other = 0, 0
  for _, thread in ipairs(threads) do
    total_created = total_created + thread:get("created")
    total_other = total_other + thread:get("other")
  end
  io.write(string.format("created %d\nother %d\n", total_created, total_other))
  for _, p in ipairs({ 50, 90, 99 }) do
    io.write(string.format("latency_p%d_us %d\n", p, latency:percentile(p)))
  end
  io.write(string.format("latency_max_us %d\n", latency.max))
end
