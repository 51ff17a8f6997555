//! The design Sluice replaces, as a `sluice bench` target: a continuous
//! token bucket in one Lua script on one Redis, called with `EVALSHA` on
//! every request — refill, check and consume atomically, `PEXPIRE` so idle
//! keys go, the time passed in by the caller (Redis's own clock is not
//! replicated into scripts). A batch of `n` decisions is `n` scripts in one
//! pipeline: one write, `n` replies, the closest Redis comes to a `Check`
//! call.
//!
//! The client is a minimal RESP2 speaker — requests are arrays of bulk
//! strings, replies parsed as far as this script needs — one connection per
//! caller (as an app's connection pool would give each in-flight request),
//! so no client-side multiplexing changes Redis's side of the comparison.

use std::time::{SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpStream, UnixStream};

/// A connection to Redis: TCP, or its Unix socket (`unix:/path`, for the
/// same-transport comparison with Sluice's `grpc_uds`).
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// KEYS[1]: the bucket. ARGV: now (µs since the epoch), capacity (the
/// limit), the period in µs, the cost. Returns {admitted 0|1, whole tokens
/// left}. Tokens refill continuously at capacity/period.
pub const SCRIPT: &str = r#"
local now = tonumber(ARGV[1])
local capacity = tonumber(ARGV[2])
local period = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local rate = capacity / period
local b = redis.call('HMGET', KEYS[1], 't', 'ts')
local tokens = tonumber(b[1])
local ts = tonumber(b[2])
if tokens == nil then
  tokens = capacity
  ts = now
end
if now > ts then
  tokens = math.min(capacity, tokens + (now - ts) * rate)
  ts = now
end
local admitted = 0
if tokens >= cost then
  tokens = tokens - cost
  admitted = 1
end
redis.call('HSET', KEYS[1], 't', tokens, 'ts', ts)
redis.call('PEXPIRE', KEYS[1], math.ceil((capacity - tokens) / rate / 1000) + 1000)
return {admitted, math.floor(tokens)}
"#;

/// One reply, as far as this client reads them.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Vec<Reply>),
}

/// One connection to Redis, with the script loaded.
pub struct Conn {
    stream: BufReader<Box<dyn Io>>,
    sha: String,
    out: Vec<u8>,
}

pub type RedisResult<T> = Result<T, String>;

impl Conn {
    pub async fn connect(addr: &str) -> RedisResult<Conn> {
        let io: Box<dyn Io> = match addr.strip_prefix("unix:") {
            Some(path) => Box::new(
                UnixStream::connect(path.trim_start_matches("//"))
                    .await
                    .map_err(|e| format!("--addr {addr}: {e}"))?,
            ),
            None => {
                let tcp = TcpStream::connect(addr)
                    .await
                    .map_err(|e| format!("--addr {addr}: {e}"))?;
                let _ = tcp.set_nodelay(true);
                Box::new(tcp)
            }
        };
        let mut conn = Conn {
            stream: BufReader::new(io),
            sha: String::new(),
            out: Vec::new(),
        };
        conn.sha = match conn
            .command(&[b"SCRIPT", b"LOAD", SCRIPT.as_bytes()])
            .await?
        {
            Reply::Bulk(Some(sha)) => String::from_utf8_lossy(&sha).into_owned(),
            other => return Err(format!("SCRIPT LOAD answered {other:?}")),
        };
        Ok(conn)
    }

    /// One command, one reply.
    pub async fn command(&mut self, args: &[&[u8]]) -> RedisResult<Reply> {
        self.out.clear();
        encode(&mut self.out, args);
        self.flush().await?;
        read(&mut self.stream).await
    }

    async fn flush(&mut self) -> RedisResult<()> {
        self.stream
            .get_mut()
            .write_all(&self.out)
            .await
            .map_err(|e| e.to_string())
    }

    /// Decide `keys` (one script call each, pipelined): whether each was
    /// admitted.
    pub async fn decide(
        &mut self,
        keys: &[String],
        limit: i64,
        period_ms: i64,
        cost: u64,
    ) -> RedisResult<Vec<bool>> {
        let now = now_micros().to_string();
        let (limit, period, cost) = (
            limit.to_string(),
            (period_ms.saturating_mul(1_000)).to_string(),
            cost.to_string(),
        );
        self.out.clear();
        for key in keys {
            encode(
                &mut self.out,
                &[
                    b"EVALSHA",
                    self.sha.as_bytes(),
                    b"1",
                    key.as_bytes(),
                    now.as_bytes(),
                    limit.as_bytes(),
                    period.as_bytes(),
                    cost.as_bytes(),
                ],
            );
        }
        self.flush().await?;
        let mut admitted = Vec::with_capacity(keys.len());
        for _ in keys {
            match read(&mut self.stream).await? {
                Reply::Array(a) => admitted.push(matches!(a.first(), Some(Reply::Int(1)))),
                Reply::Error(e) => return Err(e),
                other => return Err(format!("unexpected reply {other:?}")),
            }
        }
        Ok(admitted)
    }
}

fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// A command as a RESP array of bulk strings.
pub fn encode(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

/// Read one reply. Bounded: at most 64 levels of nesting, bulk strings of at
/// most 512 MB (Redis's own limit).
pub async fn read<R: tokio::io::AsyncBufRead + Unpin>(r: &mut R) -> RedisResult<Reply> {
    Box::pin(read_depth(r, 0)).await
}

async fn read_depth<R: tokio::io::AsyncBufRead + Unpin>(
    r: &mut R,
    depth: usize,
) -> RedisResult<Reply> {
    if depth > 64 {
        return Err("reply nested too deeply".into());
    }
    let mut line = String::new();
    let n = r.read_line(&mut line).await.map_err(|e| e.to_string())?;
    if n == 0 {
        return Err("connection closed".into());
    }
    let line = line.trim_end_matches("\r\n");
    let (kind, rest) = line.split_at(line.len().min(1));
    let int = || {
        rest.parse::<i64>()
            .map_err(|_| format!("bad RESP line {line:?}"))
    };
    match kind {
        "+" => Ok(Reply::Simple(rest.to_string())),
        "-" => Ok(Reply::Error(rest.to_string())),
        ":" => Ok(Reply::Int(int()?)),
        "$" => {
            let len = int()?;
            if len < 0 {
                return Ok(Reply::Bulk(None));
            }
            if len > 512 << 20 {
                return Err(format!("bulk string of {len} bytes"));
            }
            let mut buf = vec![0; len as usize + 2];
            r.read_exact(&mut buf).await.map_err(|e| e.to_string())?;
            buf.truncate(len as usize);
            Ok(Reply::Bulk(Some(buf)))
        }
        "*" => {
            let len = int()?;
            if len < 0 {
                return Ok(Reply::Bulk(None));
            }
            let mut items = Vec::with_capacity((len as usize).min(1024));
            for _ in 0..len {
                items.push(Box::pin(read_depth(r, depth + 1)).await?);
            }
            Ok(Reply::Array(items))
        }
        _ => Err(format!("bad RESP line {line:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn replies_parse() {
        let mut input: &[u8] = b"*2\r\n:1\r\n:41\r\n$3\r\nabc\r\n$-1\r\n-ERR no\r\n+OK\r\n";
        let mut r = tokio::io::BufReader::new(&mut input);
        assert_eq!(
            read(&mut r).await.unwrap(),
            Reply::Array(vec![Reply::Int(1), Reply::Int(41)])
        );
        assert_eq!(
            read(&mut r).await.unwrap(),
            Reply::Bulk(Some(b"abc".to_vec()))
        );
        assert_eq!(read(&mut r).await.unwrap(), Reply::Bulk(None));
        assert_eq!(read(&mut r).await.unwrap(), Reply::Error("ERR no".into()));
        assert_eq!(read(&mut r).await.unwrap(), Reply::Simple("OK".into()));
        assert!(read(&mut r).await.is_err(), "end of input");
        let mut bad: &[u8] = b"?x\r\n";
        assert!(
            read(&mut tokio::io::BufReader::new(&mut bad))
                .await
                .is_err()
        );
    }

    #[test]
    fn commands_encode() {
        let mut out = Vec::new();
        encode(&mut out, &[b"GET", b"k"]);
        assert_eq!(out, b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n");
    }
}
