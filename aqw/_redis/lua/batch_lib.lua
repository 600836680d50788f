-- The batch steps every settle shares (included by aqw/_redis/scripts.py where a script says
-- --@include batch_lib; a job of no batch runs none of it). A batch (aqw/brokers/batching.py)
-- is, under the queue's prefix (so in the queue's slot): batch:<id> (a hash: state open,
-- sealed or complete, total and each count, fail_fast, parent, keep and key_ttl in ms, and
-- per callback kind its job: cb:<kind> JSON, cbid:, cbtask:, cbstream:, cbat: enqueued_at;
-- fired:<kind> the id once enqueued), batch:<id>:todo (the set of children not final yet)
-- and batch:<id>:children (a list, in the order added). A child counts once: when it leaves
-- the todo set; the count that leaves a sealed batch's set empty enqueues its callbacks, in
-- the same step, each under the idempotency key batch:<id>:<kind> (as enqueue_unique.lua
-- writes it), and counts the batch in its parent as the child batch:<id>.
local batch_count, batch_fire, batch_settled
-- Children joining batch `key` (id `bid`): an error reply unless the batch is open, else nil.
local function batch_closed(key, bid)
  local state = redis.call('HGET', key, 'state')
  if state ~= 'open' then
    return redis.error_reply('ERR aqw batch ' .. bid .. ' is ' .. (state or 'unknown')
      .. ': no child can be added to it')
  end
  return nil
end
-- Job `job` joins batch `key` (its todo set and children list) unless it is a member (a
-- member known ahead, a flow's step): 1 when it joined, else 0.
local function batch_join(key, job)
  if redis.call('SADD', key .. ':todo', job) == 1 then
    redis.call('RPUSH', key .. ':children', job)
    return 1
  end
  return 0
end
-- After `n` children joined batch `key`: its total, and its sets kept `keep` ms.
local function batch_joined(key, n, keep)
  redis.call('HINCRBY', key, 'total', n)
  redis.call('PEXPIRE', key .. ':todo', keep)
  redis.call('PEXPIRE', key .. ':children', keep)
end
local batch_final = {succeeded = true, failed = true, dead = true, cancelled = true, expired = true}
local function batch_now()
  local t = redis.call('TIME')
  return string.format('%.6f', tonumber(t[1]) + tonumber(t[2]) / 1e6)
end
local function batch_wake(prefix, job)
  local waiters = prefix .. 'waiters:' .. job
  local inboxes = redis.pcall('SMEMBERS', waiters)
  if inboxes.err or #inboxes == 0 then
    return
  end
  for _, inbox in ipairs(inboxes) do
    redis.pcall('RPUSH', inbox, job)
    redis.pcall('PEXPIRE', inbox, 300000)
  end
  redis.call('DEL', waiters)
end
-- Ask every unfinished child of the batch to stop, as cancel.lua does: one not started ends
-- cancelled (its worker acknowledges it unrun, and that settle counts it), a running one is
-- asked to stop at its next renewal; a nested batch is stopped the same way and sealed.
local function batch_stop(prefix, bid)
  local b = prefix .. 'batch:' .. bid
  for _, child in ipairs(redis.call('SMEMBERS', b .. ':todo')) do
    if string.sub(child, 1, 6) == 'batch:' then
      local sub = string.sub(child, 7)
      if redis.call('HGET', prefix .. child, 'state') == 'open' then
        redis.call('HSET', prefix .. child, 'state', 'sealed')
      end
      batch_stop(prefix, sub)
      if redis.call('SCARD', prefix .. child .. ':todo') == 0
          and redis.call('HGET', prefix .. child, 'state') == 'sealed' then
        batch_fire(prefix, sub)
      end
    else
      local rec = prefix .. 'job:' .. child
      local state = redis.pcall('HGET', rec, 'state')
      if type(state) == 'string' and not batch_final[state] then
        if state == 'running' then
          redis.call('HSET', rec, 'cancel', '1')
        else
          redis.call('HSET', rec, 'state', 'cancelled', 'cancel', '1', 'finished_at', batch_now())
          redis.call('HINCRBY', prefix .. 'stats', 'cancelled', 1)
          batch_wake(prefix, child)
        end
      end
    end
  end
end
-- The batch is complete: its callbacks enqueued (each once: its idempotency key), its keys
-- set to live keep ms, and the batch counted in its parent.
batch_fire = function(prefix, bid)
  local b = prefix .. 'batch:' .. bid
  local h = redis.call('HMGET', b, 'total', 'succeeded', 'failed', 'cancelled', 'expired',
    'keep', 'key_ttl', 'parent', 'created_at')
  local total, ok, failed = tonumber(h[1] or 0), tonumber(h[2] or 0), tonumber(h[3] or 0)
  local cancelled, expired = tonumber(h[4] or 0), tonumber(h[5] or 0)
  local now = batch_now()
  redis.call('HSET', b, 'state', 'complete', 'completed_at', now)
  local due, ids = {}, {}
  for _, kind in ipairs({'complete', 'success', 'failure'}) do
    if kind == 'complete' or (kind == 'success' and ok == total)
        or (kind == 'failure' and failed > 0) then
      local id = redis.call('HGET', b, 'cbid:' .. kind)
      if id then
        due[#due + 1] = kind
        ids[kind] = id
      end
    end
  end
  local info = cjson.encode({id = bid, state = 'complete', total = total, pending = 0,
    succeeded = ok, failed = failed, cancelled = cancelled, expired = expired, callbacks = ids,
    created_at = h[9] or nil, completed_at = now})
  if #due == 0 then
    info = string.gsub(info, '"callbacks":%[%]', '"callbacks":{}')  -- an empty table
  end
  local input = nil  -- a flow step's payload: its parents' results (batch_input)
  local names = redis.call('HGET', b, 'inputs')
  if names and names ~= '' and #due > 0 then
    local parents = redis.call('LRANGE', b .. ':children', 0, -1)
    -- A name ending in [] is one child of a batch parent: those gathered, in order, into
    -- a list under the name before it.
    local parts, lists, i = {}, {}, 0
    for name in string.gmatch(names, '%S+') do
      i = i + 1
      local r = redis.pcall('HGET', prefix .. 'job:' .. (parents[i] or '-'), 'result')
      local value = (type(r) == 'string' and r ~= '') and r or 'null'
      local base = string.match(name, '^(.*)%[%]$')
      if base then
        local list = lists[base]
        if not list then
          list = {}
          lists[base] = list
          parts[#parts + 1] = {base, list}
        end
        list[#list + 1] = value
      else
        parts[#parts + 1] = {name, value}
      end
    end
    for _, p in ipairs(parts) do
      if type(p[2]) == 'table' then
        p[2] = '[' .. table.concat(p[2], ',') .. ']'
      end
    end
    if #parts == 1 then
      input = parts[1][2]
    else
      local out = {}
      for k, p in ipairs(parts) do
        out[k] = cjson.encode(p[1]) .. ':' .. p[2]
      end
      input = '{' .. table.concat(out, ',') .. '}'
    end
  end
  for _, kind in ipairs(due) do
    local c = redis.call('HMGET', b, 'cb:' .. kind, 'cbtask:' .. kind, 'cbstream:' .. kind,
      'cbat:' .. kind, 'cbof:' .. kind)
    local key = 'batch:' .. bid .. ':' .. kind
    local id = ids[kind]
    if not redis.call('GET', prefix .. 'done:' .. key)
        and redis.call('SET', prefix .. 'key:' .. key, id, 'NX', 'PX', h[7]) then
      local json = c[1]
      local i, j = string.find(json, '"@aqw-batch-info@"', 1, true)
      if i then
        json = string.sub(json, 1, i - 1) .. cjson.encode(info) .. string.sub(json, j + 1)
      end
      if input then
        i, j = string.find(json, '"@aqw-flow-input@"', 1, true)
        if i then
          json = string.sub(json, 1, i - 1) .. input .. string.sub(json, j + 1)
        end
      end
      redis.call('XADD', c[3], '*', 'j', json)
      local rec = prefix .. 'job:' .. id
      redis.call('DEL', rec)
      redis.call('HSET', rec, 'state', 'queued', 'task', c[2], 'attempts', '0',
        'enqueued_at', c[4], 'key', key)
      if c[5] then  -- a flow step: the batches it counts in
        redis.call('HSET', rec, 'batch', c[5])
      end
      redis.call('PEXPIRE', rec, 604800000)
      redis.call('HSET', b, 'fired:' .. kind, id)
    end
  end
  -- A flow step whose gate did not enqueue it (a parent failed): ended cancelled, unrun, and
  -- counted so in the batches it counts in (its dependants' gates cancel it in turn).
  for _, kind in ipairs({'complete', 'success', 'failure'}) do
    local c = redis.call('HMGET', b, 'cbof:' .. kind, 'cbid:' .. kind, 'cbtask:' .. kind,
      'fired:' .. kind)
    if c[1] and not c[4] then
      local rec = prefix .. 'job:' .. c[2]
      if not redis.call('HGET', rec, 'state') then
        redis.call('HSET', rec, 'state', 'cancelled', 'task', c[3], 'attempts', '0',
          'enqueued_at', batch_now(), 'finished_at', batch_now(), 'batch', c[1])
        redis.call('PEXPIRE', rec, h[6])
        batch_wake(prefix, c[2])
        batch_settled(prefix, c[1], c[2], 'cancelled')
      end
    end
  end
  for _, key in ipairs({b, b .. ':todo', b .. ':children'}) do
    redis.call('PEXPIRE', key, h[6])
  end
  if h[8] then
    local outcome = (failed > 0 and 'failed') or (cancelled > 0 and 'cancelled')
      or (expired > 0 and 'expired') or 'succeeded'
    batch_count(prefix, h[8], 'batch:' .. bid, outcome)
  end
end
-- Count member's final state in batch bid, once (nothing when it counted already).
batch_count = function(prefix, bid, member, state)
  local b = prefix .. 'batch:' .. bid
  if redis.call('SREM', b .. ':todo', member) == 0 then
    return
  end
  local kind = (state == 'dead' or state == 'failed') and 'failed' or state
  redis.call('HINCRBY', b, kind, 1)
  -- Unfinished children: total less those counted (the todo set's size, without a command).
  local h = redis.call('HMGET', b, 'state', 'fail_fast', 'total', 'succeeded', 'failed',
    'cancelled', 'expired')
  if kind == 'failed' and h[2] == '1' then
    batch_stop(prefix, bid)
  end
  local left = tonumber(h[3] or 0)
  for i = 4, 7 do
    left = left - tonumber(h[i] or 0)
  end
  if h[1] == 'sealed' and left <= 0 then
    batch_fire(prefix, bid)
  end
end
-- Count member's final state in each batch of list (space-separated ids: a flow step counts
-- in its flow and in its dependants' gates).
batch_settled = function(prefix, list, member, state)
  for bid in string.gmatch(list, '%S+') do
    batch_count(prefix, bid, member, state)
  end
end
