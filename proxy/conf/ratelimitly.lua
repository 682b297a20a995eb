-- rl-proxy --mode forward-auth as an HAProxy action (HAProxy 2.6 or later: core.httpclient).
--
--   global
--       lua-load /etc/haproxy/ratelimitly.lua
--   frontend web
--       http-request lua.ratelimitly 127.0.0.1:8081
--
-- Asks rl-proxy (its address is the action's argument) about every request, with the
-- client's address in X-Forwarded-For (written here from the connection, never taken
-- from the client), the original method and URI. Sets txn.rl_status (the answer's
-- status) and txn.rl_retry, txn.rl_state, txn.rl_policy (its Retry-After, RateLimit and
-- RateLimit-Policy) for haproxy.cfg's rules. When rl-proxy cannot be reached,
-- core.httpclient reports a 503 of its own, and so does this action when it gets no
-- answer at all: the client gets 503 (fail closed, as with nginx, Caddy and Traefik).

local function first(values)
  if values == nil then
    return nil
  end
  return values[0] or values[1]
end

core.register_action("ratelimitly", { "http-req" }, function(txn, address)
  local res = core.httpclient():get{
    url = "http://" .. address .. "/check",
    headers = {
      ["x-forwarded-for"] = { txn.f:src() },
      ["x-original-method"] = { txn.f:method() },
      ["x-original-uri"] = { txn.f:url() },
    },
    timeout = 1000,
  }
  if res == nil or res.status == nil or res.status == 0 then
    core.Warning("ratelimitly: no answer from rl-proxy at " .. address)
    txn:set_var("txn.rl_status", 503)
    return
  end
  txn:set_var("txn.rl_status", res.status)
  local h = res.headers or {}
  local fields = {
    rl_retry = first(h["retry-after"]),
    rl_state = first(h["ratelimit"]),
    rl_policy = first(h["ratelimit-policy"]),
  }
  for name, value in pairs(fields) do
    if value ~= nil then
      txn:set_var("txn." .. name, value)
    end
  end
end, 1)
