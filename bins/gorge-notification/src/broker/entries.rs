//! Stream entries as the reader sees them, and the reads that bound what one reply may hold.
//!
//! `XREAD` and `XRANGE` bound a reply by a number of entries only (`COUNT`), never by bytes,
//! so a reply can be `COUNT` times the largest entry, and one entry can be as large as
//! Redis allows (512 MB): a 100 MB `XADD` made every reader pull 100 MB per read, and a read
//! that could not finish in time was retried from the same id for ever. So every read goes
//! through [`READ_SCRIPT`], which Redis runs: it walks the entries after (or, at start,
//! before) an id and returns each one whose fields exceed the entry limit as its id and size
//! only, and stops once the reply holds [`READ_BYTES`] (always at least one entry). An
//! oversized entry is then skipped by its id without its bytes ever leaving Redis, and
//! marked, so that no read copies it again.
//!
//! Redis has no blocking read that returns ids only (the entry that ends a blocking `XREAD`
//! comes whole), so the reader blocks on no read at all: it waits for an invalidation push
//! ([`reader`](super::reader)), then reads here.

use redis::aio::MultiplexedConnection;
use redis::Value;

use super::{
    within, CALL_TIMEOUT, FIELD_FINGERPRINT, FIELD_INSTANCE, FIELD_MESSAGE, FIELD_PROBE, FIELD_SEQ,
};

/// Entries one read returns at most.
const READ_COUNT: usize = 256;

/// Bytes of entries one read returns at most (but always at least one entry): a backlog is
/// read in replies of this size, not in one reply of [`READ_COUNT`] times the largest entry.
const READ_BYTES: usize = 1 << 20;

/// The size-aware read, run by Redis (`EVALSHA`, or `EVAL` when Redis does not have it yet;
/// the broker's ACL needs `+evalsha +eval`, and for the calls it makes `+xrange +xrevrange +hgetall +hset +hdel +hlen +time +pexpire`).
/// `KEYS[1]` the stream, `KEYS[2]` (optional) its marks; `ARGV`: direction (`fwd` or
/// `rev`), the first bound (`-`/`+` or an exclusive `(id`), most entries, the entry limit in
/// bytes, most bytes, how long marks are kept (ms), most marks. Returns
/// `[[id, [field, value, …]] | [id, size], …]`, and a last element `more` when it stopped
/// before the end of the stream (the reply's entries or bytes ran out), in pages of 16 so
/// Redis never copies more than a few entries at a time.
///
/// Measuring an entry costs Redis a copy of it into Lua (0.6 s for 100 MB, blocking every
/// client meanwhile), so each one found over the limit is marked — its id and size in the
/// hash `KEYS[2]` — and later reads, of every server, walk up to a marked entry (an
/// exclusive end bound) and step over it without copying it: a cluster pays that once per
/// entry, not once per server. A mark only stands for entries over the reading server's
/// own limit (a server allowed larger messages reads the entry). Marks older than the
/// stream keeps entries go when a mark is added; past the most marks, none is added (reads
/// then pay the copy again, still skip the entry).
const READ_SCRIPT: &str = r"
local key, marks = KEYS[1], KEYS[2]
local rev, from = ARGV[1] == 'rev', ARGV[2]
local count, limit, budget = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local keep_ms, most_marks = tonumber(ARGV[6]), tonumber(ARGV[7])
local function parse(id)
  local ms, seq = string.match(id, '^(%d+)%-(%d+)$')
  if ms then return {tonumber(ms), tonumber(seq)} end
end
local function before(a, b)
  return a[1] < b[1] or (a[1] == b[1] and a[2] < b[2])
end
local function ahead(a, b)
  if rev then return before(a, b) end
  return before(b, a)
end
local barriers, next_barrier = {}, 1
if marks then
  local flat = redis.call('HGETALL', marks)
  for i = 1, #flat, 2 do
    local at, size = parse(flat[i]), tonumber(flat[i + 1])
    if at and size and size > limit then
      at[3], at[4] = flat[i], size
      barriers[#barriers + 1] = at
    end
  end
  table.sort(barriers, function(a, b) return ahead(b, a) end)
end
local function mark(id, size)
  if not marks then return end
  local now = redis.call('TIME')
  local oldest = tonumber(now[1]) * 1000 - keep_ms
  local flat = redis.call('HGETALL', marks)
  for i = 1, #flat, 2 do
    local at = parse(flat[i])
    if not at or at[1] < oldest then redis.call('HDEL', marks, flat[i]) end
  end
  if redis.call('HLEN', marks) < most_marks then
    redis.call('HSET', marks, id, size)
  end
  redis.call('PEXPIRE', marks, keep_ms)
end
local function more(out)
  out[#out + 1] = 'more'
  return out
end
local at = nil
if from ~= '-' and from ~= '+' then at = parse(string.sub(from, 2)) end
local out, used = {}, 0
while #out < count do
  while barriers[next_barrier] and at and not ahead(barriers[next_barrier], at) do
    next_barrier = next_barrier + 1
  end
  local barrier = barriers[next_barrier]
  local to = rev and '-' or '+'
  if barrier then to = '(' .. barrier[3] end
  local page
  if rev then
    page = redis.call('XREVRANGE', key, from, to, 'COUNT', 16)
  else
    page = redis.call('XRANGE', key, from, to, 'COUNT', 16)
  end
  if #page == 0 then
    if not barrier then return out end
    out[#out + 1] = {barrier[3], barrier[4]}
    from, at = '(' .. barrier[3], barrier
  else
    for _, entry in ipairs(page) do
      local size = 0
      for _, part in ipairs(entry[2]) do size = size + #part end
      if size > limit then
        out[#out + 1] = {entry[1], size}
        mark(entry[1], size)
      else
        if used + size > budget and #out > 0 then return more(out) end
        used = used + size
        out[#out + 1] = entry
      end
      if #out >= count then return more(out) end
    end
    from = '(' .. page[#page][1]
    at = parse(page[#page][1])
  end
end
return more(out)
";

/// Where [`READ_SCRIPT`] keeps the marks of a stream's oversized entries, and for how long.
#[derive(Debug, Clone, Copy)]
pub(super) struct Marks<'a> {
    pub key: &'a str,
    pub keep_ms: u64,
}

/// Marks one stream holds at most.
const MOST_MARKS: usize = 1024;

/// Which way [`read_page`] walks the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Direction {
    /// Oldest first, after an id (live reading).
    Forward,
    /// Newest first, before an id (loading history at start).
    Reverse,
}

/// One read's entries through [`READ_SCRIPT`]: after `from` (an id, or `None` for the
/// stream's start) going forward, before it (`None`: the newest) going back; each entry
/// larger than `limit` bytes as [`Item::Oversized`].
pub(super) async fn read_page(
    conn: &mut MultiplexedConnection,
    stream_key: &str,
    marks: Option<Marks<'_>>,
    direction: Direction,
    from: Option<&str>,
    limit: usize,
) -> redis::RedisResult<Vec<Item>> {
    let mut call = Call::ByHash;
    loop {
        let read = read_command(call, stream_key, marks, direction, from, limit);
        match within(CALL_TIMEOUT, read.query_async::<Value>(conn)).await {
            Ok(value) => return Ok(items_of(value, limit)),
            Err(error) => call = call.after(&error).ok_or(error)?,
        }
    }
}

/// How a read names [`READ_SCRIPT`]: by its SHA-1 (`EVALSHA`: Redis neither receives nor
/// hashes its 3 KiB again, which halved the cost of a read), or with its text (`EVAL`), once
/// Redis answered `NOSCRIPT` (restarted, or its script cache flushed); `EVAL` caches it
/// again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Call {
    ByHash,
    WithText,
}

impl Call {
    /// The call to make after `error`: with the text if Redis did not know the script.
    /// `None`: the error is not that, nothing to retry.
    pub fn after(self, error: &redis::RedisError) -> Option<Call> {
        // A pipeline's error wraps its commands' (its kind is the pipeline's): the code is
        // matched in the text, which holds every one.
        let unknown = error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
            || error.to_string().contains("NOSCRIPT");
        (self == Call::ByHash && unknown).then_some(Call::WithText)
    }
}

/// [`READ_SCRIPT`]'s SHA-1 in hex, what `EVALSHA` names it by.
fn script_hash() -> &'static str {
    static HASH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HASH.get_or_init(|| {
        let digest = ring::digest::digest(
            &ring::digest::SHA1_FOR_LEGACY_USE_ONLY,
            READ_SCRIPT.as_bytes(),
        );
        digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
    })
}

/// The command [`read_page`] sends, for a pipeline of the caller's; its reply goes to
/// [`items_of`]. Without `marks` (a key holding one entry) nothing is marked.
pub(super) fn read_command(
    call: Call,
    stream_key: &str,
    marks: Option<Marks<'_>>,
    direction: Direction,
    from: Option<&str>,
    limit: usize,
) -> redis::Cmd {
    let from = match (direction, from) {
        (Direction::Forward, None) => "-".to_string(),
        (Direction::Reverse, None) => "+".to_string(),
        (_, Some(id)) => format!("({id}"),
    };
    let way = match direction {
        Direction::Forward => "fwd",
        Direction::Reverse => "rev",
    };
    let mut read = match call {
        Call::ByHash => redis::cmd("EVALSHA").arg(script_hash()).to_owned(),
        Call::WithText => redis::cmd("EVAL").arg(READ_SCRIPT).to_owned(),
    };
    match marks {
        Some(marks) => read.arg(2).arg(stream_key).arg(marks.key),
        None => read.arg(1).arg(stream_key),
    };
    read.arg(way)
        .arg(from)
        .arg(READ_COUNT)
        .arg(limit)
        .arg(READ_BYTES)
        .arg(marks.map_or(0, |marks| marks.keep_ms))
        .arg(MOST_MARKS);
    read
}

/// One stream entry: its id and its field/value pairs.
#[derive(Debug)]
pub(super) struct StreamEntry {
    pub id: String,
    pub fields: Vec<(Vec<u8>, Vec<u8>)>,
}

impl StreamEntry {
    /// Its fields' names and values together, in bytes (what [`READ_SCRIPT`] measures).
    fn bytes(&self) -> usize {
        self.fields.iter().map(|(n, v)| n.len() + v.len()).sum()
    }
}

/// What a read returns for one entry.
#[derive(Debug)]
pub(super) enum Item {
    Entry(StreamEntry),
    /// Larger than any message of this service can be: its id and size, never its fields.
    Oversized {
        id: String,
        bytes: u64,
    },
}

impl Item {
    pub fn id(&self) -> &str {
        match self {
            Item::Entry(entry) => &entry.id,
            Item::Oversized { id, .. } => id,
        }
    }

    /// `entry`, or its id and size if it is larger than `limit`.
    fn sized(entry: StreamEntry, limit: usize) -> Item {
        let bytes = entry.bytes();
        if bytes > limit {
            Item::Oversized {
                id: entry.id,
                bytes: bytes as u64,
            }
        } else {
            Item::Entry(entry)
        }
    }
}

/// The fields this service writes, borrowed from an entry.
#[derive(Default)]
pub(super) struct Fields<'a> {
    pub fingerprint: Option<&'a [u8]>,
    pub seq: Option<u64>,
    pub instance: Option<&'a [u8]>,
    pub message: Option<&'a [u8]>,
    pub probe: bool,
}

impl<'a> Fields<'a> {
    pub fn of(pairs: &'a [(Vec<u8>, Vec<u8>)]) -> Self {
        let mut fields = Fields::default();
        for (name, value) in pairs {
            match std::str::from_utf8(name) {
                Ok(FIELD_FINGERPRINT) => fields.fingerprint = Some(value),
                Ok(FIELD_SEQ) => {
                    fields.seq = std::str::from_utf8(value).ok().and_then(|s| s.parse().ok())
                }
                Ok(FIELD_INSTANCE) => fields.instance = Some(value),
                Ok(FIELD_MESSAGE) => fields.message = Some(value),
                Ok(FIELD_PROBE) => fields.probe = true,
                _ => {}
            }
        }
        fields
    }
}

/// Whether a [`READ_SCRIPT`] reply stopped before the end of the stream (there may be more
/// to read at once).
pub(super) fn has_more(value: &Value) -> bool {
    let Value::Array(items) = value else {
        return false;
    };
    matches!(items.last(), Some(Value::BulkString(last)) if last == b"more")
}

/// The items of a [`READ_SCRIPT`] reply, `[[id, [field, value, …]], …]` with `[id, size]`
/// for an oversized entry; an entry over `limit` all the same is [`Item::Oversized`] too.
pub(super) fn items_of(value: Value, limit: usize) -> Vec<Item> {
    let Value::Array(items) = value else {
        return Vec::new();
    };
    items
        .into_iter()
        .filter_map(|item| {
            let Value::Array(mut parts) = item else {
                return None;
            };
            if parts.len() != 2 {
                return None;
            }
            let fields = parts.pop()?;
            let id = String::from_utf8(bytes_of(parts.pop()?)?).ok()?;
            match fields {
                Value::Int(bytes) => Some(Item::Oversized {
                    id,
                    bytes: bytes.max(0) as u64,
                }),
                Value::Array(flat) => {
                    let mut values = flat.into_iter().filter_map(bytes_of);
                    let mut fields = Vec::new();
                    while let (Some(name), Some(value)) = (values.next(), values.next()) {
                        fields.push((name, value));
                    }
                    Some(Item::sized(StreamEntry { id, fields }, limit))
                }
                _ => None,
            }
        })
        .collect()
}

fn bytes_of(value: Value) -> Option<Vec<u8>> {
    match value {
        Value::BulkString(bytes) => Some(bytes),
        Value::SimpleString(text) => Some(text.into_bytes()),
        _ => None,
    }
}

/// The millisecond part of a stream id (`<ms>-<seq>`).
pub(super) fn id_millis(id: &str) -> u64 {
    id.split('-')
        .next()
        .and_then(|ms| ms.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    fn entry(id: &str, fields: &[&str]) -> Value {
        Value::Array(vec![
            bulk(id),
            Value::Array(fields.iter().map(|f| bulk(f)).collect()),
        ])
    }

    #[test]
    fn script_replies_parse_into_entries() {
        let reply = Value::Array(vec![
            entry("1-0", &["fingerprint", "a", "seq", "7", "probe", "1"]),
            entry("2-5", &["instance", "x", "message", "{}"]),
            // Over the limit whatever the script said: only its id goes on.
            entry("3-0", &["message", &"x".repeat(100)]),
        ]);
        let items = items_of(reply, 64);
        assert_eq!(items.len(), 3);
        let Item::Entry(first) = &items[0] else {
            panic!("{items:?}")
        };
        let first = Fields::of(&first.fields);
        assert_eq!(
            (first.fingerprint, first.seq, first.probe),
            (Some(&b"a"[..]), Some(7), true)
        );
        let Item::Entry(second) = &items[1] else {
            panic!("{items:?}")
        };
        assert_eq!(second.id, "2-5");
        let second = Fields::of(&second.fields);
        assert_eq!(
            (second.instance, second.message, second.probe),
            (Some(&b"x"[..]), Some(&b"{}"[..]), false)
        );
        assert!(
            matches!(&items[2], Item::Oversized { id, bytes: 107 } if id == "3-0"),
            "{items:?}"
        );
        assert!(items_of(Value::Nil, 64).is_empty());
        assert_eq!(id_millis("1733300000123-4"), 1_733_300_000_123);
    }

    #[test]
    fn the_script_is_called_by_its_sha1_until_redis_does_not_know_it() {
        assert_eq!(script_hash().len(), 40);
        let noscript = redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::NoScript),
            "NOSCRIPT No matching script",
        ));
        assert_eq!(Call::ByHash.after(&noscript), Some(Call::WithText));
        assert_eq!(Call::WithText.after(&noscript), None);
        let io = redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        assert_eq!(Call::ByHash.after(&io), None);
    }

    #[test]
    fn the_script_marks_an_oversized_entry_by_id_and_size() {
        let reply = Value::Array(vec![
            entry("1-0", &["message", "{}"]),
            Value::Array(vec![bulk("2-0"), Value::Int(104_857_600)]),
            bulk("more"),
        ]);
        assert!(has_more(&reply));
        assert!(!has_more(&Value::Array(vec![entry("1-0", &["a", "b"])])));
        let items = items_of(reply, 1024);
        assert_eq!(items.len(), 2, "{items:?}");
        assert!(matches!(&items[0], Item::Entry(e) if e.id == "1-0"));
        assert!(
            matches!(&items[1], Item::Oversized { id, bytes: 104_857_600 } if id == "2-0"),
            "{items:?}"
        );
    }
}
