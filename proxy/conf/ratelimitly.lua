-- rl-proxy --mode forward-auth as an HAProxy action (Lua 5.3; tested with HAProxy 2.6).
--
--   global
--       lua-load /etc/haproxy/ratelimitly.lua
--   frontend web
--       http-request lua.ratelimitly 127.0.0.1:8081
--
-- Asks rl-proxy (its address is the action's argument) about every request, with the
-- client's address in X-Forwarded-For (written here from the connection, never taken
-- from the client), the original method and URI. Sets txn.rl_status (200 granted, 429
-- rejected, 503 anything else) and txn.rl_retry, txn.rl_state, txn.rl_policy (its
-- Retry-After, RateLimit and RateLimit-Policy) for haproxy.cfg's rules.
--
-- The check is one HTTP/1.1 exchange on a socket of its own (core.tcp), not
-- core.httpclient: in HAProxy 2.6 the latter retries a refused connection 3 times, a
-- second apart, so a client waited 3 s for its 503 while rl-proxy was down. Here a
-- refused connection fails at once and a silent rl-proxy after 1 s: the client gets 503
-- with Retry-After: 1 (fail closed, as with nginx, Caddy, Traefik and Envoy), and
-- HAProxy's log gets a warning (the first failure, then at most one a second with the
-- count since the last).

local TIMEOUT_S = 1

local failures = { unlogged = 0, last = nil }

local function warn(address, why)
  failures.unlogged = failures.unlogged + 1
  local now = core.now().sec
  if failures.last == nil or now - failures.last >= 1 then
    core.Warning("ratelimitly: no answer from rl-proxy at " .. address .. " (" .. why
      .. "): 503 for " .. failures.unlogged .. " request(s)")
    failures.last = now
    failures.unlogged = 0
  end
end

-- The status and the lower-cased header fields of rl-proxy's answer, or nil and why.
local function check(address, txn)
  local host, port = address:match("^(.+):(%d+)$")
  if host == nil then
    return nil, "address is not HOST:PORT"
  end
  host = host:gsub("^%[(.*)%]$", "%1")
  local s = core.tcp()
  s:settimeout(TIMEOUT_S)
  if not s:connect(host, tonumber(port)) then
    return nil, "cannot connect"
  end
  local req = "GET /check HTTP/1.1\r\nHost: " .. address .. "\r\n"
    .. "X-Forwarded-For: " .. txn.f:src() .. "\r\n"
    .. "X-Original-Method: " .. txn.f:method() .. "\r\n"
    .. "X-Original-URI: " .. txn.f:url() .. "\r\n"
    .. "Connection: close\r\n\r\n"
  if s:send(req) == nil then
    s:close()
    return nil, "cannot send"
  end
  local line = s:receive("*l")
  local status = line and tonumber(line:match("^HTTP/1%.%d (%d%d%d)"))
  if status == nil then
    s:close()
    return nil, "no status line"
  end
  local fields = {}
  for _ = 1, 100 do
    line = s:receive("*l")
    if line == nil or line == "" then
      break
    end
    local name, value = line:match("^([^:]+):%s*(.-)%s*$")
    if name ~= nil then
      fields[name:lower()] = value
    end
  end
  s:close()
  return status, fields
end

core.register_action("ratelimitly", { "http-req" }, function(txn, address)
  local status, fields = check(address, txn)
  if status == nil then
    warn(address, fields)
    txn:set_var("txn.rl_status", 503)
    return
  end
  if status >= 200 and status < 300 then
    txn:set_var("txn.rl_status", 200)
  elseif status == 429 then
    txn:set_var("txn.rl_status", 429)
  else
    -- rl-proxy's --on-failure closed answer (503), or any other
    txn:set_var("txn.rl_status", 503)
  end
  local vars = {
    rl_retry = fields["retry-after"],
    rl_state = fields["ratelimit"],
    rl_policy = fields["ratelimit-policy"],
  }
  for name, value in pairs(vars) do
    if value ~= nil then
      txn:set_var("txn." .. name, value)
    end
  end
end, 1)
