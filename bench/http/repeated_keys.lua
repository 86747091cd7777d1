-- wrk script: POST cycling through KEYS keys (default 64) that a warm-up run already used, so
-- through idem every request is a replay. wrk -s bench/http/repeated_keys.lua URL -- RUN_ID [KEYS]
local counter = 0

function init(args)
  run_id = args[1] or "run"
  keys = tonumber(args[2] or "64")
end

local body = '{"amount":500,"currency":"eur","customer":"c-1234"}'

function request()
  counter = counter + 1
  local key = '"' .. run_id .. "-repeated-" .. (counter % keys) .. '"'
  return wrk.format("POST", nil,
    {["Idempotency-Key"] = key, ["Content-Type"] = "application/json"}, body)
end
