"""The server-side (Lua) scripts of the shared session table on Redis.

Every script runs atomically on the Redis server and reads the time from the server
(``TIME``), so all routers expire sessions and leases by one clock. Keys (``KEYS``), all under
one prefix with a hash tag so they live in one slot: ``pins`` (hash: session id -> worker),
``last`` (sorted set: session id -> last access, ms), ``counts`` (hash: worker -> sessions),
``version`` (integer, incremented on every change of a pin), ``routers`` (sorted set: router
id -> lease deadline, ms), ``releases`` (sorted set: session id -> when it was released, ms;
the last ``memory`` ms of releases, so a router's write-back of a cached pin after Redis lost
its data does not bring back a session released meanwhile). Besides them: ``epoch`` (a token
identifying the data set) and each router's in-flight counts, a hash ``<prefix>lease:<id>``
(``i:<worker>`` -> requests, ``t:<worker>`` -> tokens) that expires with its lease.
"""

from __future__ import annotations

__all__ = ["LOAD", "PIN", "RELEASE", "SWEEP"]

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

_KEEP = """
local function keep(ttl_ms)
  local ms = tonumber(ttl_ms) + 60000
  for i = 1, 4 do
    redis.call('PEXPIRE', KEYS[i], ms)
  end
end
"""
"""The table's keys expire a minute after the TTL from their last use: a fleet that is gone
leaves nothing behind (every session in it has expired by then anyway)."""

_DROP = """
local function drop(sid, worker)
  redis.call('HDEL', KEYS[1], sid)
  redis.call('ZREM', KEYS[2], sid)
  if worker ~= '' and redis.call('HINCRBY', KEYS[3], worker, -1) <= 0 then
    redis.call('HDEL', KEYS[3], worker)
  end
end
"""

LOAD = (
    _NOW
    + _KEEP
    + _DROP
    + """
-- ARGV: session id ('' for none), TTL ms, lease ms, router id, lease key prefix,
--       then field, value pairs of this router's lease (i:<worker> n, t:<worker> tokens).
-- Returns {pin or '', version, counts (flat), other routers' lease sums (flat), expired}.
local sid = ARGV[1]
local pin = false
local expired = 0
if sid ~= '' then
  pin = redis.call('HGET', KEYS[1], sid)
  if pin then
    local last = tonumber(redis.call('ZSCORE', KEYS[2], sid) or '0')
    if now - last >= tonumber(ARGV[2]) then
      drop(sid, pin)
      redis.call('INCR', KEYS[4])
      pin = false
      expired = 1
    else
      redis.call('ZADD', KEYS[2], now, sid)
      keep(ARGV[2])
    end
  end
end
local me = ARGV[4]
local lease = ARGV[5] .. me
redis.call('DEL', lease)
if #ARGV > 5 then
  redis.call('HSET', lease, unpack(ARGV, 6))
  redis.call('PEXPIRE', lease, ARGV[3])
end
redis.call('ZADD', KEYS[5], now + tonumber(ARGV[3]), me)
redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now)
local sums = {}
local names = {}
for _, r in ipairs(redis.call('ZRANGE', KEYS[5], 0, -1)) do
  if r ~= me then
    local kv = redis.call('HGETALL', ARGV[5] .. r)
    for i = 1, #kv, 2 do
      local k = kv[i]
      if sums[k] == nil then
        sums[k] = 0
        names[#names + 1] = k
      end
      sums[k] = sums[k] + tonumber(kv[i + 1])
    end
  end
end
local remote = {}
for _, k in ipairs(names) do
  remote[#remote + 1] = k
  remote[#remote + 1] = sums[k]
end
local version = tonumber(redis.call('GET', KEYS[4]) or '0')
return {pin or '', version, redis.call('HGETALL', KEYS[3]), remote, expired}
"""
)
"""Before a decision: the session's pin (touched; dropped when idle past the TTL), the counts,
the version and the other routers' in-flight sums; writes this router's lease."""

PIN = (
    _NOW
    + _KEEP
    + _DROP
    + """
-- ARGV: session id, worker, expected version ('' for none; 'absent' pins only a session
--       without a pin that was not released lately: a write-back), max sessions, TTL ms.
-- Returns {1 pinned | 0 refused, the session's pin or '', version, counts (flat)}.
local sid = ARGV[1]
local worker = ARGV[2]
local cur = redis.call('HGET', KEYS[1], sid)
local version = tonumber(redis.call('GET', KEYS[4]) or '0')
local want = ARGV[3]
local stale = want ~= '' and want ~= 'absent' and tonumber(want) ~= version
local gone = want == 'absent' and redis.call('ZSCORE', KEYS[6], sid)
if (want == 'absent' and cur) or stale or gone then
  return {0, cur or '', version, redis.call('HGETALL', KEYS[3])}
end
redis.call('ZREM', KEYS[6], sid)
if cur then
  drop(sid, cur)
end
local max = tonumber(ARGV[4])
while redis.call('ZCARD', KEYS[2]) >= max do
  local oldest = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
  drop(oldest, redis.call('HGET', KEYS[1], oldest) or '')
end
redis.call('HSET', KEYS[1], sid, worker)
redis.call('ZADD', KEYS[2], now, sid)
redis.call('HINCRBY', KEYS[3], worker, 1)
version = redis.call('INCR', KEYS[4])
keep(ARGV[5])
return {1, worker, version, redis.call('HGETALL', KEYS[3])}
"""
)
"""Commit a placement: compare-and-set on the version (or a write-back: pin if absent and not
released lately), moving the count; a session placed again is no longer "released"."""

RELEASE = (
    _NOW
    + _DROP
    + """
-- ARGV: session id, channel, memory ms. Returns 1 when it was pinned.
redis.call('PUBLISH', ARGV[2], ARGV[1])
redis.call('ZADD', KEYS[6], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', now - tonumber(ARGV[3]))
redis.call('PEXPIRE', KEYS[6], ARGV[3])
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if not cur then
  return 0
end
drop(ARGV[1], cur)
redis.call('INCR', KEYS[4])
return 1
"""
)
"""``/finish_session``: drop a session's pin and its count, and tell every router (a message
on the channel, even when Redis had no pin: after a loss of its data the routers' cached
pins are what would bring it back); remember the release for ``memory`` ms (to 2x that:
the set is trimmed on each release and expires ``memory`` ms after the last), so that a
router that missed the message (not subscribed yet after Redis came back) cannot write the
pin back."""

SWEEP = (
    _NOW
    + _DROP
    + """
-- ARGV: TTL ms, at most this many sessions. Returns how many expired.
local old = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now - tonumber(ARGV[1]),
                       'LIMIT', 0, tonumber(ARGV[2]))
for _, sid in ipairs(old) do
  drop(sid, redis.call('HGET', KEYS[1], sid) or '')
end
if #old > 0 then
  redis.call('INCR', KEYS[4])
end
redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now)
return #old
"""
)
"""The sweep: expire every session idle past the TTL (bounded per call); forget dead routers."""
