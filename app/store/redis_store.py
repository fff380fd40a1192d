"""The Redis store: the label log as a Redis stream, served state in hashes.

Keys of one project share the hash tag ``{prefix:p:name}`` so multi-key scripts and
transactions stay in one Redis Cluster slot. Project names are checked by the API
(``[A-Za-z0-9_.-]``); item and worker ids are only ever hash fields, never key names.
``{prefix}:wake`` holds at most one token, pushed after every append: the idle engine blocks
on it (``wait_for_append``). ``{prefix}:moves`` is a stream of the projects appended to (the
last minute of it): an engine asks only those whether their log has news (``moved_since``).
"""

from __future__ import annotations

import contextlib
import operator
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit

import orjson
import redis
from redis.cluster import ClusterNode, RedisCluster

from app.store.base import (
    AppendResult,
    EngineBehindError,
    EntryKind,
    KeyRecord,
    LeaseLostError,
    LogEntry,
    LogRewoundError,
    Progress,
    ProjectExistsError,
    ProjectRecord,
    QueueHead,
    StateUpdate,
    StoreWipedError,
    UnknownProjectError,
)
from app.store.item_records import grow_lists, record_size, render_values

_T = TypeVar("_T")


def _nothing() -> None:
    pass


_SLOT_MOVED = "Slot rebalancing"
"""How redis-py's cluster transaction reports a redirection (its slot moving) met while it
watched keys: a ``WatchError``, the transaction not executed."""


def cannot_save(exc: BaseException) -> bool:
    """Whether ``exc`` is Redis refusing writes because it cannot save to its disk (``MISCONF``:
    an RDB save or an AOF write failed, a full disk most often; with
    ``stop-writes-on-bgsave-error``, Redis's default). It refuses them whole, PING too, and
    serves reads; writes are taken again once a save succeeds. redis-py has no class for it:
    the reply's error code is in its message (after "Command # n (...) of pipeline caused
    error: " in a pipeline's)."""
    return isinstance(exc, redis.exceptions.ResponseError) and "MISCONF " in str(exc)


STORE_MOVING: tuple[type[Exception], ...] = (
    redis.exceptions.TryAgainError,  # a multi-key command while its slot's keys are split
    redis.exceptions.AskError,  # (MovedError too) redirections past the client's retries
    redis.exceptions.ClusterError,  # ClusterDownError, and "TTL exhausted" after the retries
    redis.exceptions.SlotNotCoveredError,  # a slot no primary serves yet
    redis.exceptions.ReadOnlyError,  # a write to a node that turned replica (a failover)
)
"""What Redis answers while it moves: a Redis Cluster moving a slot's keys between nodes or
electing a primary, a node demoted to replica by a failover (``RedisStore.is_moving``). The
command was refused whole (a script or a transaction fails at its first write, which a
replica refuses), and succeeds once the slot or the primary has settled."""

# The lag (ms) of a project, as a Lua function of the log stream, its served state, its
# sequence and Redis' clock (TIME, in ms): how long the first entry past the applied position
# has waited, from its append time (field 't'; 0 when it has none: put back by a restore), or
# the entries past it times the engine's recent ms per entry (the state's entry_ms) plus its
# recent ms per step (step_ms: a new entry also waits for the step it joins), whichever is
# longer; 0 when no entry waits.
_LAG_FN = """
local function lag_ms(log, state, seq, now)
  local applied = tonumber(redis.call('HGET', state, 'applied') or '0')
  local first = redis.call('XRANGE', log, (applied + 1) .. '-0', '+', 'COUNT', 1)
  if #first == 0 then return 0 end
  local age = 0
  local f = first[1][2]
  for i = 1, #f, 2 do
    if f[i] == 't' then age = math.max(now - tonumber(f[i + 1]), 0) end
  end
  local per_entry = tonumber(redis.call('HGET', state, 'entry_ms') or '0')
  local step = tonumber(redis.call('HGET', state, 'step_ms') or '0')
  local waiting = tonumber(redis.call('GET', seq) or '0') - applied
  return math.max(age, math.floor(waiting * per_entry + step))
end
local clock = redis.call('TIME')
local stamp = clock[1] .. string.format('%03d', math.floor(tonumber(clock[2]) / 1000))
local now = tonumber(stamp)
"""

# KEYS: log stream, served state, sequence. The lag in ms: how long the oldest entry not applied
# has waited, or the time the engine will take to apply those waiting at its recent pace (the
# state's entry_ms and step_ms), whichever is longer.
_LAG = _LAG_FN + "return lag_ms(KEYS[1], KEYS[2], KEYS[3], now)\n"

# KEYS: ids set, log stream, sequence, served state. ARGV: kind, payload, with ids, token, the
# bound on the lag in ms ('' = none), then the label ids joined by line breaks ('' = no id; an
# id holds no control character, app/api/schemas.py), their count, and '1' when every label
# has an id and no two the same: one argument to pack, not one per label, and the set asked and
# added to one command per 1,000 ids, not one per id (SMISMEMBER: Redis 6.2 or later); a block
# of distinct ids none of which the set holds (what clients send) is kept whole without a
# look at each id in Lua (the script's time per 1,000 such ids 0.77 -> 0.55 ms). Refuses
# ({-1, lag}) when the lag passes the bound; else marks each label 1 (new) or 0 (id seen
# before, in the set or earlier in the block), appends the entry (with its time, 't') unless
# nothing is new; with KEYS[5] (the engine's seal: the last position it has read), 'j' = 1 when
# the entry before is still unread (LogEntry.joins), else 0. The entry's stream id is
# ``position-token``: the token (random) tells this entry from another one at the same
# position after Redis went back in time.
LOG_NOT_OPEN = -2
"""The append script's answer for a project whose log is not open (no sequence key)."""

_APPEND = (
    _LAG_FN
    + """
if redis.call('EXISTS', KEYS[3]) == 0 then return {-2, 0} end
if ARGV[5] ~= '' then
  local lag = lag_ms(KEYS[2], KEYS[4], KEYS[3], now)
  if lag > tonumber(ARGV[5]) then return {-1, lag} end
end
local with_ids = tonumber(ARGV[3])
local n = with_ids == 1 and tonumber(ARGV[7]) or 0
local distinct = ARGV[8] == '1'
local named, at = {}, {}
if distinct then
  local i = 0
  for id in string.gmatch(ARGV[6], '[^\\n]+') do i = i + 1; named[i] = id end
else
  local text, from = ARGV[6], 1
  for i = 1, n do
    local stop = string.find(text, '\\n', from, true) or (#text + 1)
    local id = string.sub(text, from, stop - 1)
    from = stop + 1
    if id ~= '' then named[#named + 1] = id; at[#at + 1] = i end
  end
end
local seen, repeats = {}, 0
for lo = 1, #named, 1000 do
  local got = redis.call('SMISMEMBER', KEYS[1], unpack(named, lo, math.min(lo + 999, #named)))
  for j = 1, #got do seen[lo + j - 1] = got[j]; repeats = repeats + got[j] end
end
local new, accepted, mask = named, n, nil
if not (distinct and repeats == 0) then
  local keep, fresh = {}, {}
  for i = 1, n do keep[i] = '1' end
  if distinct then for j = 1, n do at[j] = j end end
  new, accepted = {}, n - #named
  for j = 1, #named do
    local id = named[j]
    if seen[j] == 1 or fresh[id] then
      keep[at[j]] = '0'
    else
      fresh[id] = true; new[#new + 1] = id; accepted = accepted + 1
    end
  end
  mask = table.concat(keep)
else
  mask = string.rep('1', n)
end
for lo = 1, #new, 1000 do
  redis.call('SADD', KEYS[1], unpack(new, lo, math.min(lo + 999, #new)))
end
if with_ids == 1 and accepted == 0 then
  return {tonumber(redis.call('GET', KEYS[3]) or '0'), 0}
end
local pos = redis.call('INCR', KEYS[3])
local joins = '0'
if KEYS[5] and pos - 1 > tonumber(redis.call('GET', KEYS[5]) or '0') then joins = '1' end
redis.call(
  'XADD', KEYS[2], pos .. '-' .. ARGV[4], 'k', ARGV[1], 'p', ARGV[2], 'm', mask, 't', stamp,
  'j', joins)
return {pos, accepted}
"""
)

# KEYS: log stream, sequence. ARGV: position, token. 1: the log holds that entry, or held it and
# trimmed it (position 0 too); 0: it does not (a shorter log, or another entry there).
_HOLDS = """
local pos = tonumber(ARGV[1])
if pos == 0 then return 1 end
local seq = tonumber(redis.call('GET', KEYS[2]) or '0')
if seq < pos then return 0 end
local at = redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1], 'COUNT', 1)
if #at > 0 then
  if at[1][1] == ARGV[1] .. '-' .. ARGV[2] then return 1 end
  return 0
end
local first = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)
if #first == 0 then return 1 end
if tonumber(string.match(first[1][1], '^(%d+)')) > pos then return 1 end
return 0
"""

# The anchor check of _HOLDS (unless ARGV[2] is '') and (ARGV[5] unless '') that the served
# state (KEYS[3]) is still at that applied position; then up to ARGV[4] entries from id
# ARGV[3], and with ARGV[6] = '1' the last of them marked read in KEYS[4] (the seal: an entry
# appended past an unread one joins it, LogEntry.joins). A seal behind ARGV[1] also fails the
# read: Redis went back to before the reader's last read, and an entry appended since may
# join the run the reader closed there (``sealed_through``).
_READ = (
    "local function holds()\n"
    + _HOLDS
    + "end\n"
    + """
if ARGV[2] ~= '' and holds() == 0 then return {0} end
if ARGV[5] ~= '' and (redis.call('HGET', KEYS[3], 'applied') or '0') ~= ARGV[5] then
  return {0}
end
if ARGV[6] == '1' and tonumber(ARGV[1]) > tonumber(redis.call('GET', KEYS[4]) or '0') then
  return {0}
end
local found = redis.call('XRANGE', KEYS[1], ARGV[3], '+', 'COUNT', ARGV[4])
if ARGV[6] == '1' and #found > 0 then
  local last = tonumber(string.match(found[#found][1], '^(%d+)'))
  if last > tonumber(redis.call('GET', KEYS[4]) or '0') then redis.call('SET', KEYS[4], last) end
end
return {1, found}
"""
)

# KEYS: log stream. ARGV: anchor id, MINID. Trims only while the anchor entry is there.
_TRIM = """
if #redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1]) == 0 then return 0 end
redis.call('XTRIM', KEYS[1], 'MINID', ARGV[2])
return 1
"""


def _entry(entry_id: bytes, fields: Any) -> LogEntry:
    position, token = entry_id.split(b"-")
    if isinstance(fields, list):  # (from a script: a flat list)
        fields = dict(zip(fields[::2], fields[1::2], strict=True))
    joins = fields.get(b"j") == b"1"  # (entries logged before joins were: False)
    return LogEntry(
        int(position), fields[b"k"].decode(), fields[b"p"], fields[b"m"], int(token), joins
    )


def _joined_ids(ids: list[str | None]) -> str:
    """A block's label ids as the append script reads them: one text, a line break between
    ids ('' for a label without one)."""
    text = "\n".join(["" if i is None else i for i in ids])
    if text.count("\n") != max(len(ids) - 1, 0):
        raise ValueError("a label id holds a line break")
    return text


def _rewound(
    project: str, update: StateUpdate, holds: bool, sealed: int, served: int, at: int
) -> str | None:
    """Why a state write finds the log or the served state not as its engine left them
    (None: as left), naming the check that failed."""
    if not holds:
        return f"{project}: the log no longer holds entry {update.position} as it was read"
    if at > sealed:
        return (f"{project}: the log's seal (the last entry read) is at {sealed}, behind entry "
                f"{at} that this write covers: Redis lost a read")  # fmt: skip
    if update.served is not None and served != update.served:
        return f"{project}: the served state is at {served}, not {update.served}"
    return None


def new_token() -> int:
    """A log entry's token: random, 62 bits (fits a signed BIGINT), never 0 or 1."""
    return secrets.randbits(62) | 2


# KEYS: the project's log, seq, state, fence and seal (and on a single Redis the projects'
# hash). ARGV: the position and token a state write ends at (position 0: not checked), and the
# project's name. What a state write checks, read in one round trip: whether the log holds that
# entry (as _HOLDS), the applied position served, the fence, the seal (the last position the
# engine read: a write past it is of a read Redis lost), whether the project exists (1 when
# not asked: on a cluster that hash lives on another node, asked first).
_CHECK = (
    "local function holds()\n"
    + _HOLDS
    + "\nend\n"
    + """
local applied = tonumber(redis.call('HGET', KEYS[3], 'applied') or '0')
local fence = tonumber(redis.call('GET', KEYS[4]) or '0')
local sealed = tonumber(redis.call('GET', KEYS[5]) or '0')
local known = 1
if KEYS[6] then known = redis.call('HEXISTS', KEYS[6], ARGV[3]) end
return {holds(), applied, fence, sealed, known}
"""
)

_STATE_KEYS = (
    "ids", "log", "seq", "state", "rows", "items", "workers", "queue", "draters", "dtasks",
    "restoring", "lease", "fence", "sealed",
)  # fmt: skip

# KEYS: the project's lease and fence. ARGV: the holder, the lease in ms. The holder renews;
# a free lease is taken and the fence (the fencing token) grows. Returns the token, or 0 when
# another engine holds the lease.
_ACQUIRE = """
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return tonumber(redis.call('GET', KEYS[2]) or '0')
end
if holder then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return redis.call('INCR', KEYS[2])
"""

# KEYS: the project's lease. ARGV: the holder.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
"""

# KEYS: (log stream, state hash) per project. ARGV: per project, the id of the entry the engine
# is at ('' at position 0) and its served position ('' unchecked). Per project 1 when the log
# ends at that entry (or is empty at 0) and the state is served at that position: a read
# would return nothing and raise nothing.
_QUIET = """
local out = {}
for i = 1, #KEYS, 2 do
  local last = redis.call('XREVRANGE', KEYS[i], '+', '-', 'COUNT', 1)[1]
  local quiet = (last and last[1] or '') == ARGV[i]
  if quiet and ARGV[i + 1] ~= '' then
    quiet = (redis.call('HGET', KEYS[i + 1], 'applied') or '0') == ARGV[i + 1]
  end
  out[#out + 1] = quiet and 1 or 0
end
return out
"""
QUIET_BATCH = 1000
"""Projects checked by one call of the script (it blocks Redis for a few ms at most)."""

MOVES_KEPT_MS = 60_000
"""How long the moves stream keeps an append's record (trimmed by Redis' clock)."""
MOVES_READ = 10_000
"""Records read by one ``moved_since`` (more wait for the next call)."""

# KEYS: the moves stream. ARGV: the project, MOVES_KEPT_MS. Records the append, and trims the
# records older than MOVES_KEPT_MS by Redis' own clock (whole nodes only: '~').
_MOVE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('XADD', KEYS[1], 'MINID', '~', tostring(now - tonumber(ARGV[2])), '*', 'p', ARGV[1])
"""

# KEYS: the engines' heartbeats (holder -> Redis time in ms). ARGV: this holder, the time in ms
# after which a silent engine counts as gone. Returns the engines alive.
# KEYS: the engines' hash. ARGV: the time an engine counts as alive after it was seen (ms).
# _ALIVE without noting anyone (on the node that holds the hash: its clock stamped them).
_SEEN = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local all = redis.call('HGETALL', KEYS[1])
local alive = {}
for i = 1, #all, 2 do
  if now - tonumber(all[i + 1]) < tonumber(ARGV[1]) then table.insert(alive, all[i]) end
end
return alive
"""

_ALIVE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], ARGV[1], now)
local all = redis.call('HGETALL', KEYS[1])
local alive = {}
for i = 1, #all, 2 do
  if now - tonumber(all[i + 1]) < tonumber(ARGV[2]) then
    table.insert(alive, all[i])
  else
    redis.call('HDEL', KEYS[1], all[i])
  end
end
return alive
"""

# KEYS: the project's restore marker. ARGV: the position the state now covers. The served
# state is rebuilt once it reaches the marker's position.
_RESTORED = """
local t = redis.call('GET', KEYS[1])
if t and tonumber(t) <= tonumber(ARGV[1]) then redis.call('DEL', KEYS[1]) end
return 0
"""


class NotReplicatedError(redis.exceptions.TimeoutError):
    """Fewer replicas than asked have an appended block (the API's 503 store_unavailable)."""


def _node(url: str) -> ClusterNode:
    parts = urlsplit(url if "//" in url else f"redis://{url}")
    if not parts.hostname:
        raise ValueError(f"REDIS_URL: {url!r} names no host")
    return ClusterNode(parts.hostname, parts.port or 6379)  # type: ignore[no-untyped-call]


class RedisStore:
    log_in_sql = False
    unreached: frozenset[str] = frozenset()

    def __init__(
        self,
        url: str,
        prefix: str = "ct",
        timeout_s: float | None = 10.0,
        cluster: bool = False,
        wait_replicas: int = 0,
        wait_timeout_ms: int = 1000,
        join_entries: bool = False,
    ) -> None:
        """``timeout_s``: how long one command may wait for Redis (connecting included)
        before it raises redis' TimeoutError (the API's 503); None or 0 waits forever.
        ``cluster``: ``url`` names one node of a Redis Cluster, or several separated by
        commas (the first one's credentials apply to all); the client starts from any that
        answers, finds the others and follows the slots as they move. ``wait_replicas``: an
        append returns once that many replicas of the project's primary have it (``WAIT``, up
        to ``wait_timeout_ms``; fewer raise ``NotReplicatedError``, a 503: the block is in the
        log, to be re-posted). ``join_entries``: an entry appended while the one before it is
        unread by the engine joins it (``LogEntry.joins``); False logs every entry alone."""
        self.join_entries = join_entries
        wait = timeout_s or None
        first, *more = [u.strip() for u in url.split(",") if u.strip()] or [url]
        if more and not cluster:
            raise ValueError(
                f"REDIS_URL lists {len(more) + 1} nodes: a list is for a Redis Cluster "
                "(CROWDTALLY_REDIS_CLUSTER=true); a single Redis takes one URL"
            )
        options: dict[str, Any] = {"socket_timeout": wait, "socket_connect_timeout": wait}
        if cluster:  # any listed node that answers tells the client the others
            options["startup_nodes"] = [_node(u) for u in more]
        client = RedisCluster if cluster else redis.Redis
        self.r: Any = client.from_url(first, **options)  # untyped client: replies are bytes
        self.cluster = cluster
        self.wait_replicas, self.wait_timeout_ms = wait_replicas, wait_timeout_ms
        self.prefix = prefix
        self._scripts: list[Any] = []  # (every one registered: ``_load_scripts``)
        self._append = self._register(_APPEND)
        self._lag = self._register(_LAG)
        self._holds = self._register(_HOLDS)
        self._read = self._register(_READ)
        self._trim = self._register(_TRIM)
        self._check = self._register(_CHECK)
        self._acquire = self._register(_ACQUIRE)
        self._release = self._register(_RELEASE)
        self._seen = self._register(_SEEN)
        self._alive = self._register(_ALIVE)
        self._quiet = self._register(_QUIET)

    def _register(self, source: str) -> Any:
        script = self.r.register_script(source)
        self._scripts.append(script)
        return script

    def _k(self, project: str, what: str) -> str:
        return f"{{{self.prefix}:p:{project}}}:{what}"

    @property
    def _projects_key(self) -> str:
        return f"{self.prefix}:projects"

    @property
    def _wake_key(self) -> str:
        return f"{self.prefix}:wake"

    @property
    def _moves_key(self) -> str:
        return f"{self.prefix}:moves"

    @property
    def _failed_key(self) -> str:
        return f"{self.prefix}:failed"

    @property
    def _keys_key(self) -> str:
        return f"{self.prefix}:keys"

    # projects and keys -----------------------------------------------------------------
    def create_project(self, record: ProjectRecord) -> None:
        if not self.r.hsetnx(self._projects_key, record.name, record.to_json()):
            raise ProjectExistsError(record.name)
        # (what a block appended as an earlier one went left goes; the log opens at 0)
        self._drop_state(record.name, open_log=True)
        self._catalogue_changed()

    def restore_project(
        self, record: ProjectRecord, entries: list[LogEntry], ids: list[str], end: int
    ) -> bool:
        """Put a project back from its archive (a wiped Redis): its log first,
        then its record, so that neither an engine nor an append finds it without its log.
        False, and nothing changed, when the project's log is open already (another process
        put it back, or the project was never gone)."""
        seq = self._k(record.name, "seq")
        with self.r.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(seq)
                if pipe.exists(seq):
                    return False
                pipe.multi()
                for what in _STATE_KEYS:
                    pipe.delete(self._k(record.name, what))
                self._queue_restore(pipe, record.name, entries, ids, end)
                pipe.execute()
            except redis.exceptions.WatchError:
                return False
        self._moved(self.r.pipeline(transaction=False), record.name).execute()
        if not self.r.hsetnx(self._projects_key, record.name, record.to_json()):
            return False
        self._catalogue_changed()
        return True

    def open_logs(self, projects: Sequence[str]) -> None:
        """Open the log of every project listed that has none (created by a version that
        opened it with its first append: an append now refuses a project whose log is not
        open, as a wiped store's are)."""
        pipe = self.r.pipeline(transaction=False)
        for name in projects:
            pipe.set(self._k(name, "seq"), 0, nx=True)
        pipe.execute()

    def _catalogue_changed(self) -> None:
        """A new random token after the change (not a counter: a wiped Redis would count
        again from the start and could repeat a token an engine holds)."""
        self.r.set(f"{self._projects_key}:token", secrets.token_hex(8))

    def catalogue_token(self) -> str | None:
        token = self.r.get(f"{self._projects_key}:token")
        return token.decode() if token is not None else None

    def get_project(self, name: str) -> ProjectRecord | None:
        blob = self.r.hget(self._projects_key, name)
        return ProjectRecord.from_json(blob) if blob else None

    def list_projects(self) -> list[ProjectRecord]:
        blobs: dict[bytes, bytes] = self.r.hgetall(self._projects_key)
        return sorted((ProjectRecord.from_json(b) for b in blobs.values()), key=lambda r: r.name)

    def project_names(self) -> list[str]:
        return sorted(k.decode() for k in self.r.hkeys(self._projects_key))

    def delete_project(self, name: str) -> bool:
        if not self.r.hdel(self._projects_key, name):
            return False
        self._catalogue_changed()
        keys: dict[bytes, bytes] = self.r.hgetall(self._keys_key)
        doomed = [h for h, b in keys.items() if orjson.loads(b).get("project") == name]
        pipe = self.r.pipeline()
        if doomed:
            pipe.hdel(self._keys_key, *doomed)
        pipe.hdel(self._failed_key, name)
        pipe.execute()
        self._drop_state(name)
        return True

    def _drop_state(self, name: str, open_log: bool = False) -> None:
        """Delete every key of project ``name``'s log and served state (then, if
        ``open_log``, open an empty log: appends take a project only with an open log)."""
        pipe = self.r.pipeline()
        for what in _STATE_KEYS:
            pipe.delete(self._k(name, what))
        if open_log:
            pipe.set(self._k(name, "seq"), 0)
        pipe.execute()

    def put_key(self, key_hash: str, record: KeyRecord) -> None:
        self.r.hset(self._keys_key, key_hash, orjson.dumps(record.__dict__))

    def get_key(self, key_hash: str) -> KeyRecord | None:
        blob = self.r.hget(self._keys_key, key_hash)
        return KeyRecord(**orjson.loads(blob)) if blob else None

    def list_keys(self, project: str | None) -> dict[str, KeyRecord]:
        out = {}
        for h, b in self.r.hgetall(self._keys_key).items():
            k = KeyRecord(**orjson.loads(b))
            if k.project == project:
                out[h.decode()] = k
        return out

    def delete_key(self, key_hash: str) -> bool:
        pipe = self.r.pipeline()
        pipe.hdel(self._keys_key, key_hash)
        # (the admin pointer only names the first admin key; it may name a revoked one)
        pipe.get(f"{self.prefix}:admin")
        gone, admin = pipe.execute()
        if admin is not None and admin.decode() == key_hash:
            others = self.list_keys(None)
            if others:
                self.r.set(f"{self.prefix}:admin", next(iter(others)))
            else:
                self.r.delete(f"{self.prefix}:admin")
        return bool(gone)

    def replace_admin_key(self, key_hash: str, record: KeyRecord) -> list[str]:
        doomed = [h for h in self.list_keys(None) if h != key_hash]
        pipe = self.r.pipeline()
        pipe.hset(self._keys_key, key_hash, orjson.dumps(record.__dict__))
        pipe.set(f"{self.prefix}:admin", key_hash)
        if doomed:
            pipe.hdel(self._keys_key, *doomed)
        pipe.execute()
        return doomed

    def admin_key_hash(self) -> str | None:
        h = self.r.get(f"{self.prefix}:admin")
        return h.decode() if h else None

    def set_admin_key_hash(self, key_hash: str) -> bool:
        if not self.r.set(f"{self.prefix}:admin", key_hash, nx=True):
            return False
        self.put_key(key_hash, KeyRecord(key_hash[:12], "admin", None, time.time()))
        return True

    # the log ---------------------------------------------------------------------------
    def append(
        self,
        project: str,
        kind: EntryKind,
        payload: bytes,
        ids: list[str | None] | None = None,
        max_lag_s: float | None = None,
    ) -> AppendResult:
        bound = "" if max_lag_s is None else int(max_lag_s * 1000)
        args: list[Any] = [kind, payload, 0 if ids is None else 1, new_token(), bound]
        if ids is not None:
            distinct = all(ids) and len(set(ids)) == len(ids)
            args.extend((_joined_ids(ids), len(ids), 1 if distinct else 0))
        names = ("ids", "log", "seq", "state", "sealed")[: 5 if self.join_entries else 4]
        keys = [self._k(project, what) for what in names]
        (position, accepted), known = self._append_and_wake(project, keys, args)
        if int(position) == LOG_NOT_OPEN:
            self._refuse_unopened(project)
        if int(position) < 0:
            raise EngineBehindError(project, int(accepted) / 1000)
        if known is None:
            known = self.r.hexists(self._projects_key, project)
        if not known:  # deleted meanwhile: the block
            self._drop_state(project)  # went to keys of no project (a project created later
            raise UnknownProjectError(project)  # under its name would have read them)
        n = len(ids) if ids is not None else 0
        return AppendResult(
            int(position),
            int(accepted) if ids is not None else 0,
            n - int(accepted) if ids is not None else 0,
        )

    def _refuse_unopened(self, project: str) -> None:
        """The append found no open log (nothing was written): the project was deleted, or
        the store was wiped (a Redis restarted empty) and is not yet rebuilt from SQL."""
        if self.admin_key_hash() is None:
            raise StoreWipedError(f"project {project!r}")
        if not self.r.hexists(self._projects_key, project):
            raise UnknownProjectError(project)
        # (its record made, its log not yet: a creation under way, or a project of an older
        # version never appended to, whose log the API's next start opens)
        raise StoreWipedError(f"project {project!r}")

    def _append_and_wake(
        self, project: str, keys: list[str], args: list[Any]
    ) -> tuple[Any, bool | None]:
        """The append script, then the project's record in the moves stream and a token on
        the engines' wake list (kept to one: a waiting engine wakes at once, a busy one finds
        it at its next idle wait), in one round trip. EVALSHA rather than the script object:
        in a pipeline that one asks SCRIPT EXISTS first, a second round trip per append. On a
        single Redis the same round trip asks whether the project still exists, after the
        append (else None: asked by the caller). On a cluster, the record and the token follow
        the append's answer: they live on other nodes, and a pipeline keeps the order of its
        commands on each node only."""

        def run() -> tuple[Any, bool | None]:
            if self.wait_replicas:
                return self._append_replicated(project, keys, args), None
            pipe = self.r.pipeline(transaction=False)
            # (execute_command: redis-py's cluster pipeline refuses its evalsha method, yet
            # routes the command itself by the keys' slot)
            pipe.execute_command("EVALSHA", self._append.sha, len(keys), *keys, *args)
            if self.cluster:
                answer = pipe.execute()[0]
                self._moved(self.r.pipeline(transaction=False), project).execute()
                return answer, None
            self._moved(pipe, project).hexists(self._projects_key, project)
            replies = pipe.execute()
            return replies[0], bool(replies[-1])

        try:
            return run()
        except redis.exceptions.NoScriptError:  # a restarted Redis: the script is gone
            self.r.script_load(_APPEND)
            return run()

    def _moved(self, pipe: Any, project: str) -> Any:
        """Queue on ``pipe``: the project's record in the moves stream (EVAL: a script cache
        lost with a restart would fail EVALSHA after the append went through), then the
        engines' wake token."""
        pipe.execute_command("EVAL", _MOVE, 1, self._moves_key, project, MOVES_KEPT_MS)
        pipe.lpush(self._wake_key, b"1")
        pipe.ltrim(self._wake_key, 0, 0)
        return pipe

    def _append_replicated(self, project: str, keys: list[str], args: list[Any]) -> Any:
        """The append script, then ``WAIT`` on the same connection (it counts the replicas
        that have this connection's writes): on a cluster, the connection to the primary
        that holds the project's slot."""
        node = (
            self.r.get_redis_connection(self.r.get_node_from_key(keys[0]))
            if self.cluster
            else self.r
        )

        def append_then_wait() -> Any:
            pipe = node.pipeline(transaction=False)
            pipe.execute_command("EVALSHA", self._append.sha, len(keys), *keys, *args)
            pipe.execute_command("WAIT", self.wait_replicas, self.wait_timeout_ms)
            return pipe.execute()

        try:
            try:
                result, replicas = append_then_wait()
            except redis.exceptions.NoScriptError:  # a promoted replica: a script cache is
                node.script_load(_APPEND)  # not replicated
                result, replicas = append_then_wait()
        except (redis.exceptions.ResponseError, redis.exceptions.ConnectionError) as exc:
            moved = isinstance(exc, redis.exceptions.ResponseError) and "MOVED" in str(exc)
            if not self.cluster or not (moved or isinstance(exc, redis.ConnectionError)):
                raise
            self.recover()  # the slot moved (a failover): the next try asks the new primary
            raise redis.exceptions.ConnectionError(f"the project's primary moved ({exc})") from exc
        self._moved(self.r.pipeline(transaction=False), project).execute()
        if int(replicas) < self.wait_replicas:
            raise NotReplicatedError(
                f"{int(replicas)} of {self.wait_replicas} replicas acknowledged the block "
                f"within {self.wait_timeout_ms} ms; it is in the log: post it again (same ids)"
            )
        return result

    def read_log(
        self,
        project: str,
        after: int,
        limit: int,
        anchor: int | None = None,
        served: int | None = None,
        seal: bool = False,
    ) -> list[LogEntry]:
        log = self._k(project, "log")
        if anchor is None and not seal:
            return [_entry(i, f) for i, f in self.r.xrange(log, min=f"{after + 1}-0", count=limit)]
        keys = [log, self._k(project, "seq"), self._k(project, "state"), self._k(project, "sealed")]
        args: list[Any] = [
            after, "" if anchor is None else anchor, f"{after + 1}-0", limit,
            "" if served is None else served, 1 if seal else 0,
        ]  # fmt: skip
        found = self._read(keys=keys, args=args)
        if not found[0]:
            raise LogRewoundError(
                f"{project}: the log no longer holds entry {after}, or the served state is no "
                f"longer at {served}"
            )
        return [_entry(i, f) for i, f in found[1]]

    def holds(self, project: str, position: int, token: int) -> bool:
        keys = [self._k(project, "log"), self._k(project, "seq")]
        return bool(self._holds(keys=keys, args=[position, token])) and self.sealed_through(
            project, position
        )

    def sealed_through(self, project: str, position: int) -> bool:
        """The log's seal (the engine's last read) is at ``position`` or past it. Redis gone
        back to before that read (an AOF that missed it) may hold the entry still, but an
        entry appended since may join the run an engine closed there (``LogEntry.joins``):
        a state at that position, in memory or snapshotted, no longer matches a replay."""
        return position <= int(self.r.get(self._k(project, "sealed")) or 0)

    def _queue_restore(
        self, pipe: Any, project: str, entries: list[LogEntry], ids: list[str], end: int
    ) -> None:
        """Queue on ``pipe``: archived entries put back (positions and tokens kept), the seen
        ids, the log end."""
        for e in entries:
            pipe.xadd(
                self._k(project, "log"),
                {"k": e.kind, "p": e.payload, "m": e.keep, "j": b"1" if e.joins else b"0"},
                id=f"{e.position}-{e.token}",
            )
        for lo in range(0, len(ids), 10_000):
            pipe.sadd(self._k(project, "ids"), *ids[lo : lo + 10_000])
        pipe.set(self._k(project, "seq"), end)
        pipe.set(self._k(project, "sealed"), end)  # (an entry appended next starts its group)
        if end:  # served once the engine's state reaches the end (see ``restoring``)
            pipe.set(self._k(project, "restoring"), end)

    def _read_together(self, *reads: Callable[[Any], object]) -> list[Any]:
        """Each of ``reads`` (a call on a pipeline) in one transaction. Redis at its maxmemory
        refuses every command queued in a transaction, reads too: then as a plain pipeline,
        so reads go on while the store is full. It reads what one transaction would, as the
        writes that change these keys (the engine's state, appends) are refused meanwhile;
        only a deletion's DELs are not, and a read beside one may see part of it."""

        def run(transaction: bool) -> list[Any]:
            pipe = self.r.pipeline(transaction=transaction)
            for read in reads:
                read(pipe)
            return pipe.execute()  # type: ignore[no-any-return]

        try:
            return run(transaction=True)
        except redis.exceptions.OutOfMemoryError:
            return run(transaction=False)

    def log_start(self, project: str) -> int:
        first, seq = self._read_together(
            lambda p: p.xrange(self._k(project, "log"), count=1),
            lambda p: p.get(self._k(project, "seq")),
        )
        return int(first[0][0].split(b"-")[0]) if first else int(seq or 0) + 1

    def trim(self, project: str, upto: int, anchor: tuple[int, int] | None = None) -> None:
        if anchor is None:
            self.r.xtrim(self._k(project, "log"), minid=f"{upto + 1}-0")
        else:
            anchor_id = f"{anchor[0]}-{anchor[1]}"
            self._trim(keys=[self._k(project, "log")], args=[anchor_id, f"{upto + 1}-0"])

    def keys_for(self, project: str) -> dict[str, KeyRecord]:
        out = {}
        for h, b in self.r.hgetall(self._keys_key).items():
            k = KeyRecord(**orjson.loads(b))
            if k.project in (None, project):
                out[h.decode()] = k
        return out

    def log_end(self, project: str) -> int:
        v = self.r.get(self._k(project, "seq"))
        return int(v) if v else 0

    def quiet_logs(self, heads: Mapping[str, tuple[int, int | None, int | None]]) -> set[str]:
        self.unreached = frozenset()
        try:
            return self._quiet_of(heads)
        except (redis.ConnectionError, redis.TimeoutError):
            if not self.cluster:
                raise

        def ask(group: list[str]) -> set[str]:
            return self._quiet_of({project: heads[project] for project in group})

        quiet: set[str] = set()
        unreached: set[str] = set()
        for group, found in self._node_by_node(list(heads), ask):
            if found is None:
                unreached.update(group)
            else:
                quiet |= found
        self.unreached = frozenset(unreached)
        return quiet

    def _node_by_node(
        self, projects: list[str], call: Callable[[list[str]], _T]
    ) -> list[tuple[list[str], _T | None]]:
        """``call`` on the projects of each cluster node in turn (every key of a project is on
        one node), after a call on all of them met a node that does not answer (a primary
        failing over): the other nodes' answers, and None for the projects of a node that
        still does not answer."""
        self.recover()  # (the layout read anew: a dead default node would fail every group)
        nodes: dict[str, list[str]] = {}
        for project in projects:
            node = self.r.get_node_from_key(self._k(project, "log")).name
            nodes.setdefault(node, []).append(project)
        answers: list[tuple[list[str], _T | None]] = []
        for group in nodes.values():
            try:
                answers.append((group, call(group)))
            except (redis.ConnectionError, redis.TimeoutError):
                answers.append((group, None))
        return answers

    def _quiet_of(self, heads: Mapping[str, tuple[int, int | None, int | None]]) -> set[str]:
        names = list(heads)
        keys, args = [], []
        for project, (position, token, served) in heads.items():
            keys += [self._k(project, "log"), self._k(project, "state")]
            args += [f"{position}-{token}" if position else "", "" if served is None else served]
        # a script's keys share a slot: on a cluster one call a project
        batch = 2 if self.cluster else 2 * QUIET_BATCH

        def calls(pipe: Any) -> None:
            for lo in range(0, 2 * len(names), batch):
                self._queue_script(pipe, self._quiet, keys[lo : lo + batch], args[lo : lo + batch])

        # (one round trip, on a cluster per node; a project whose slot is moving is not
        # quiet: its own read fails, and the engine goes on with the others)
        replies = self._pipelined(calls, moving_ok=True)
        found: list[int] = []
        for lo, call in zip(range(0, 2 * len(names), batch), replies, strict=True):
            found += (
                [0] * (len(keys[lo : lo + batch]) // 2) if isinstance(call, Exception) else call
            )
        return {p for p, quiet in zip(names, found, strict=True) if quiet}

    def moved_since(self, cursor: str | None) -> tuple[str | None, set[str] | None]:
        # The cursor is the id of the last record read ("0-0": none was kept, so whether
        # records came and went since cannot be told). Records older than MOVES_KEPT_MS
        # before the newest may be trimmed: a cursor older than half that may have missed
        # some (an engine that did not look for 30 s looks at everything).
        pipe = self.r.pipeline(transaction=False)
        pipe.xrevrange(self._moves_key, count=1)
        if cursor is not None:
            pipe.xrange(self._moves_key, min=f"({cursor}", count=MOVES_READ)
        newest, *read = pipe.execute()
        last = _stream_id(newest[0][0]) if newest else (0, 0)
        if cursor is None:
            return _id_text(last), None
        since = _stream_id(cursor)
        if not newest:  # nothing kept: none appended yet, or a Redis that lost the stream
            return "0-0", (set() if since == (0, 0) else None)
        if last < since or last[0] - since[0] > MOVES_KEPT_MS // 2:
            return _id_text(last), None
        records = read[0]
        moved = {fields[b"p"].decode() for _, fields in records}
        return (records[-1][0].decode() if records else cursor), moved

    def lag_seconds(self, project: str) -> float:
        keys = [self._k(project, what) for what in ("log", "state", "seq")]
        return int(self._lag(keys=keys)) / 1000

    def positions(self, projects: Sequence[str]) -> dict[str, tuple[int, int]]:
        def reads(pipe: Any, p: str) -> None:
            pipe.get(self._k(p, "seq"))
            pipe.hget(self._k(p, "state"), "applied")

        return {
            p: (int(end or 0), int(applied or 0))
            for p, (end, applied) in self._read_each(projects, reads, 2)
        }

    def progress(self, projects: Sequence[str]) -> dict[str, Progress]:
        def reads(pipe: Any, p: str) -> None:
            pipe.get(self._k(p, "seq"))
            pipe.hmget(self._k(p, "state"), ["applied", "globals"])
            lag_keys = [self._k(p, what) for what in ("log", "state", "seq")]
            self._queue_script(pipe, self._lag, lag_keys, [])
            pipe.zcard(self._k(p, "queue"))

        return {
            p: Progress(int(end or 0), int(applied or 0), int(lag_ms) / 1000, int(queued), blob)
            for p, (end, (applied, blob), lag_ms, queued) in self._read_each(projects, reads, 4)
        }

    def _pipelined(self, calls: Callable[[Any], None], moving_ok: bool = False) -> list[Any]:
        """The replies of the commands (reads) ``calls`` queues on a pipeline, in one round
        trip; with ``moving_ok``, a command refused because Redis is moving (``is_moving``)
        has its error as its reply instead of raising it. Its scripts go by their hashes: when
        Redis lacks one (a restart, a failover, SCRIPT FLUSH), every script is loaded and the
        pipeline sent once more."""

        def execute() -> list[Any]:
            pipe = self.r.pipeline(transaction=False)
            calls(pipe)
            replies: list[Any] = pipe.execute(raise_on_error=not moving_ok)
            if moving_ok:
                for reply in replies:
                    if isinstance(reply, Exception) and not self.is_moving(reply):
                        raise reply
            return replies

        try:
            return execute()
        except redis.exceptions.NoScriptError:
            self._load_scripts()
            return execute()

    def _load_scripts(self) -> None:
        for script in self._scripts:
            self.r.script_load(script.script)

    def _queue_script(self, pipe: Any, script: Any, keys: list[str], args: list[Any]) -> None:
        """Queue a registered script on ``pipe``: by its hash (EVALSHA: redis-py's script
        object would first ask SCRIPT EXISTS, a round trip more; a lost script is loaded by
        ``_pipelined``), or on a cluster by its source (EVAL: redis-py's cluster pipelines
        refuse EVALSHA)."""
        if self.cluster:
            pipe.execute_command("EVAL", script.script, len(keys), *keys, *args)
        else:
            pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)

    def _read_each(
        self, projects: Sequence[str], reads: Callable[[Any, str], None], per: int
    ) -> list[tuple[str, list[Any]]]:
        """In one pipelined round trip (on a cluster, one per node): which projects exist, and
        ``reads`` queued for each (``per`` replies); the replies of those that exist."""
        if not projects:
            return []

        def calls(pipe: Any) -> None:
            pipe.hmget(self._projects_key, list(projects))
            for p in projects:
                reads(pipe, p)

        found, *rest = self._pipelined(calls)
        return [
            (p, rest[per * n : per * (n + 1)])
            for n, p in enumerate(projects)
            if found[n] is not None
        ]

    # served state ----------------------------------------------------------------------
    def write_state(self, project: str, update: StateUpdate) -> None:
        checked = update.anchor is not None or update.fence is not None
        asked_first = self.cluster or not checked  # (else the check asks: one round trip)
        if asked_first and not self.r.hexists(self._projects_key, project):
            return
        state = self._k(project, "state")
        with self.r.pipeline(transaction=True) as pipe:
            if checked:
                # The state covers the log up to update.position: written only while the log
                # holds that very entry, the served state is where the writer left it, and (a
                # pool's engine) its fencing token is still the project's; checked and written
                # on one connection (a change or a restart of Redis in between fails it).
                fence = self._k(project, "fence")
                pipe.watch(state, fence)
                sealed = self._k(project, "sealed")
                keys = [self._k(project, "log"), self._k(project, "seq"), state, fence, sealed]
                at = [update.position, update.anchor] if update.anchor is not None else [0, 0]
                if not asked_first:
                    keys.append(self._projects_key)
                holds, was, token, read, known = self._evalsha(
                    pipe, self._check, keys, [*at, project]
                )
                if not known:  # deleted: nothing to write
                    pipe.reset()
                    return
                if update.fence is not None and int(token) != update.fence:
                    pipe.reset()
                    raise LeaseLostError(f"{project}: another engine holds it now")
                why = _rewound(project, update, bool(holds), int(read), int(was), at[0])
                if why is not None:
                    pipe.reset()
                    raise LogRewoundError(why)
                pipe.multi()
            undo = self._queue_state(pipe, project, state, update)
            try:
                pipe.execute()
            except BaseException as exc:
                undo()  # (the lists as Redis still holds them: the update may be sent again)
                if not isinstance(exc, redis.WatchError):
                    raise
                if self.cluster and str(exc).startswith(_SLOT_MOVED):
                    raise redis.exceptions.TryAgainError(
                        f"{project}: its slot moved while its state was written; nothing was written"
                    ) from exc  # (refused whole: is_moving)
                if not self.r.hexists(self._projects_key, project):
                    return  # the project was deleted meanwhile
                if update.fence is not None:
                    current = int(self.r.get(self._k(project, "fence")) or 0)
                    if current != update.fence:
                        raise LeaseLostError(f"{project}: another engine took it over") from exc
                # (a connection lost while watching: Redis restarted, perhaps from an older
                # log; the engine restores and replays, then writes again)
                raise LogRewoundError(f"{project}: the state write was cut off ({exc})") from exc

    def _queue_state(
        self, pipe: Any, project: str, state: str, update: StateUpdate
    ) -> Callable[[], None]:
        """Queue the update's writes; returns what undoes its growth of the written lists."""
        undo = _nothing
        pipe.hset(state, mapping={"globals": update.globals})
        if update.rows:
            pipe.hset(self._k(project, "rows"), mapping={str(s): b for s, b in update.rows.items()})
        items = update.items
        if items:
            lists = items.written  # (each list is sent whole: a script's read, join and
            undo = grow_lists(lists, items)  # write of each cost more than sending it)
            lists_of = map(lists.__getitem__, items.names)
            values = map(operator.add, items.records, lists_of)  # a record, then its labels
            pipe.hset(
                self._k(project, "items"), mapping=dict(zip(items.names, values, strict=True))
            )
        if update.workers:
            pipe.hset(self._k(project, "workers"), mapping=update.workers)
        if update.queue_replace:
            pipe.delete(self._k(project, "queue"))
        if update.queue:
            pipe.zadd(self._k(project, "queue"), update.queue)
        if update.queue_remove:
            pipe.zrem(self._k(project, "queue"), *update.queue_remove)
        if update.queue_settings is not None:
            pipe.hset(state, "queue_settings", update.queue_settings)
        if update.dyadic is not None:
            pipe.hset(state, mapping={"dyadic": update.dyadic.shared,
                                      "dyadic_at": update.dyadic.position})  # fmt: skip
            for what, rows in (("draters", update.dyadic.raters), ("dtasks", update.dyadic.tasks)):
                if rows:
                    pipe.hset(self._k(project, what), mapping={str(s): b for s, b in rows.items()})
        if update.entry_s is not None:
            pipe.hset(state, "entry_ms", f"{1000 * update.entry_s:.3f}")
        if update.step_s is not None:
            pipe.hset(state, "step_ms", f"{1000 * update.step_s:.3f}")
        if update.advance:
            pipe.hset(state, "applied", update.position)
            pipe.execute_command(
                "EVAL", _RESTORED, 1, self._k(project, "restoring"), update.position
            )
        return undo

    def _evalsha(self, client: Any, script: Any, keys: list[str], args: list[Any]) -> Any:
        """A registered script run on ``client`` (a watching pipeline) by its digest, loaded
        first if Redis lacks it (redis-py's cluster pipeline refuses its own evalsha method,
        which the script objects call; the command itself is routed by its keys' slot)."""
        try:
            return client.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            self.r.script_load(script.script)  # on every primary of a cluster
            return client.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)

    def applied_position(self, project: str) -> int:
        v = self.r.hget(self._k(project, "state"), "applied")
        return int(v) if v else 0

    def get_item(self, project: str, item: str) -> bytes | None:
        return self.get_items(project, [item])[0]

    def get_params(self, project: str, slots: list[int]) -> tuple[bytes | None, list[bytes | None]]:
        res = self._read_together(
            lambda p: p.hget(self._k(project, "state"), "globals"),
            *([lambda p: p.hmget(self._k(project, "rows"), [str(s) for s in slots])]
              if slots else []),
        )  # fmt: skip
        return res[0], (res[1] if slots else [])

    def get_dyadic(
        self, project: str, raters: list[int], tasks: list[int]
    ) -> tuple[int, bytes | None, list[bytes | None], list[bytes | None]]:
        res = self._read_together(
            lambda p: p.hmget(self._k(project, "state"), ["dyadic_at", "dyadic"]),
            *([lambda p: p.hmget(self._k(project, "draters"), [str(s) for s in raters])]
              if raters else []),
            *([lambda p: p.hmget(self._k(project, "dtasks"), [str(s) for s in tasks])]
              if tasks else []),
        )  # fmt: skip
        (learned, shared), rest = res[0], res[1:]
        r = rest.pop(0) if raters else []
        t = rest.pop(0) if tasks else []
        return int(learned or 0), shared, r, t

    def scan_items(
        self, project: str, cursor: int, count: int
    ) -> tuple[int, list[tuple[str, bytes]]]:
        nxt, page = self.r.hscan(self._k(project, "items"), cursor=cursor, count=count)
        names = [k.decode() for k in page]
        return int(nxt), list(zip(names, render_values(list(page.values())), strict=True))

    def scan_records(
        self, project: str, cursor: int, count: int
    ) -> tuple[int, list[str], list[bytes]]:
        nxt, page = self.r.hscan(self._k(project, "items"), cursor=cursor, count=count)
        records = [v[: record_size(v)] for v in page.values()]  # (each value: record, labels)
        return int(nxt), [k.decode() for k in page], records

    def get_worker(self, project: str, worker: str) -> bytes | None:
        blob: bytes | None = self.r.hget(self._k(project, "workers"), worker)
        return blob

    def read_queue(self, project: str, count: int) -> list[tuple[str, float]]:
        rows = self.r.zrevrange(self._k(project, "queue"), 0, count - 1, withscores=True)
        return [(k.decode(), float(v)) for k, v in rows]

    def queue_size(self, project: str) -> int:
        return int(self.r.zcard(self._k(project, "queue")))

    def queue_head(self, project: str, count: int) -> QueueHead:
        queue = self._k(project, "queue")
        rows, size, (blob, settings) = self._read_together(
            lambda p: p.zrevrange(queue, 0, count - 1, withscores=True),
            lambda p: p.zcard(queue),
            lambda p: p.hmget(self._k(project, "state"), ["globals", "queue_settings"]),
        )
        return QueueHead([(k.decode(), float(v)) for k, v in rows], int(size), blob, settings)

    def get_items(self, project: str, items: list[str]) -> list[bytes | None]:
        if not items:
            return []
        values: list[bytes | None] = self.r.hmget(self._k(project, "items"), items)
        rendered = iter(render_values([v for v in values if v is not None]))
        return [None if v is None else next(rendered) for v in values]

    def queue_settings(self, project: str) -> bytes | None:
        blob: bytes | None = self.r.hget(self._k(project, "state"), "queue_settings")
        return blob

    def all_workers(self, project: str) -> list[tuple[str, bytes]]:
        d: dict[bytes, bytes] = self.r.hgetall(self._k(project, "workers"))
        return [(k.decode(), v) for k, v in d.items()]

    def set_project_failed(self, project: str, error: str | None) -> None:
        if error is None:
            self.r.hdel(self._failed_key, project)
        elif self.r.hexists(self._projects_key, project):
            self.r.hset(self._failed_key, project, error)

    def restoring(self) -> dict[str, int]:
        names = self.project_names()
        pipe = self.r.pipeline(transaction=False)
        for name in names:
            pipe.get(self._k(name, "restoring"))
        return {n: int(v) for n, v in zip(names, pipe.execute(), strict=True) if v}

    def restoring_target(self, project: str) -> int:
        return int(self.r.get(self._k(project, "restoring")) or 0)

    def failed_projects(self) -> dict[str, str]:
        d: dict[bytes, bytes] = self.r.hgetall(self._failed_key)
        return {k.decode(): v.decode() for k, v in d.items()}

    # engine pools ------------------------------------------------------------------------
    def acquire_lease(self, project: str, holder: str, ttl_s: float) -> int:
        keys = [self._k(project, "lease"), self._k(project, "fence")]
        return int(self._acquire(keys=keys, args=[holder, max(int(ttl_s * 1000), 1)]))

    def renew_leases(self, projects: list[str], holder: str, ttl_s: float) -> list[int | None]:
        if not projects:
            return []
        try:
            return self._renew(projects, holder, ttl_s)
        except (redis.ConnectionError, redis.TimeoutError):
            if not self.cluster:
                raise
        # The unreachable node's leases are neither renewed nor lost (None); else one node's
        # failover would let every lease of every engine of a pool lapse.
        tokens: dict[str, int | None] = {}
        for group, renewed in self._node_by_node(projects, lambda g: self._renew(g, holder, ttl_s)):
            tokens.update(zip(group, renewed or [None] * len(group), strict=True))
        return [tokens[project] for project in projects]

    def _renew(self, projects: list[str], holder: str, ttl_s: float) -> list[int | None]:
        ms = max(int(ttl_s * 1000), 1)
        pipe = self.r.pipeline(transaction=False)
        for project in projects:
            keys = [self._k(project, "lease"), self._k(project, "fence")]
            pipe.execute_command("EVALSHA", self._acquire.sha, len(keys), *keys, holder, ms)
        replies = pipe.execute(raise_on_error=False)  # (a slot moving: the others renewed)
        if any(isinstance(r, redis.exceptions.NoScriptError) for r in replies):
            return [self.acquire_lease(p, holder, ttl_s) for p in projects]  # (each loads it)
        for reply in replies:
            if isinstance(reply, Exception) and not self.is_moving(reply):
                raise reply
        return [None if isinstance(t, Exception) else int(t) for t in replies]

    def release_lease(self, project: str, holder: str) -> None:
        self._release(keys=[self._k(project, "lease")], args=[holder])

    def engines_alive(self, holder: str, ttl_s: float) -> list[str]:
        alive = self._alive(keys=[f"{self.prefix}:engines"], args=[holder, int(ttl_s * 1000)])
        return sorted(a.decode() for a in alive)

    def lease_holder(self, project: str) -> str | None:
        holder = self.r.get(self._k(project, "lease"))
        return holder.decode() if holder else None

    def pool_engines(self, ttl_s: float) -> list[str]:
        seen = self._seen(keys=[f"{self.prefix}:engines"], args=[int(ttl_s * 1000)])
        return sorted(a.decode() for a in seen)

    def record_loads(
        self, changes: Mapping[str, tuple[str, float] | None], read: bool = True
    ) -> dict[str, tuple[str, float]]:
        key = f"{self.prefix}:loads"
        pipe = self.r.pipeline(transaction=False)
        kept = {p: orjson.dumps(list(r)) for p, r in changes.items() if r is not None}
        if kept:
            pipe.hset(key, mapping=kept)
        if gone := [p for p, r in changes.items() if r is None]:
            pipe.hdel(key, *gone)
        if not read:
            pipe.execute()
            return {}
        pipe.hgetall(key)
        records = pipe.execute()[-1]
        return {p.decode(): tuple(orjson.loads(v)) for p, v in records.items()}

    def wait_for_append(self, timeout_s: float) -> None:
        # BLPOP's timeout is in seconds, fractions allowed (Redis >= 6); 0 would block for good
        self.r.blpop([self._wake_key], timeout=max(timeout_s, 0.001))

    def is_full(self, exc: BaseException) -> bool:
        # (noeviction refuses a script's or a transaction's first write past maxmemory, and
        # then nothing of it is written; so does a Redis that cannot save to its disk)
        return isinstance(exc, redis.exceptions.OutOfMemoryError) or cannot_save(exc)

    def is_moving(self, exc: BaseException) -> bool:
        return isinstance(exc, STORE_MOVING)

    def node_down(self, exc: BaseException) -> bool:
        return self.cluster and isinstance(exc, (redis.ConnectionError, redis.TimeoutError))

    def ping(self) -> bool:
        try:
            return bool(self.r.ping())
        except redis.RedisError as exc:
            return cannot_save(exc)  # (it answered: it refuses writes, even PING, not reads)

    def recover(self) -> None:
        """On a cluster, its slots and primaries read anew. redis-py looks up the keys of a
        cluster pipeline's commands on its default node (COMMAND GETKEYS) and, when that
        primary died, goes on asking it: every pipeline then fails, even once its replica
        has taken over, until the layout is read again (which picks a live default node).
        On a single Redis, its idle connections closed: a READONLY reply leaves its
        connection open to a node that a failover made a replica, and new connections find
        the primary that the address now names."""
        if self.cluster:
            with contextlib.suppress(redis.RedisError):
                self.r.nodes_manager.initialize()
        else:
            self.r.connection_pool.disconnect(inuse_connections=False)

    def close(self) -> None:
        if self.cluster:  # RedisCluster.close leaves its nodes' connection pools open
            for node in self.r.get_nodes():
                if node.redis_connection is not None:
                    node.redis_connection.connection_pool.disconnect()
        self.r.close()

    def flush_prefix(self) -> None:
        """Delete every key under this store's prefix (tests)."""
        for pattern in (f"{self.prefix}:*", f"{{{self.prefix}:*"):
            for key in self.r.scan_iter(match=pattern, count=1000):
                self.r.delete(key)


def _stream_id(raw: bytes | str) -> tuple[int, int]:
    """A stream entry id ("ms-seq") as a pair that orders as Redis orders ids."""
    ms, _, seq = (raw.decode() if isinstance(raw, bytes) else raw).partition("-")
    return int(ms), int(seq or 0)


def _id_text(sid: tuple[int, int]) -> str:
    return f"{sid[0]}-{sid[1]}"
