-- wrk script: POST with a new Idempotency-Key on every request (every request is a first one).
-- wrk -s bench/http/unique_keys.lua URL -- RUN_ID
local counter = 0
local threads = 0

function setup(thread)
  threads = threads + 1
  thread:set("thread_id", threads)
end

function init(args)
  run_id = args[1] or "run"
end

local body = '{"amount":500,"currency":"eur","customer":"c-1234"}'

function request()
  counter = counter + 1
  local key = '"' .. run_id .. "-" .. thread_id .. "-" .. counter .. '"'
  return wrk.format("POST", nil,
    {["Idempotency-Key"] = key, ["Content-Type"] = "application/json"}, body)
end
