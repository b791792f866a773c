//! A minimal RESP2 client: just enough to inspect a server from a test.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};

use crate::TestkitError;

/// How long [`send_command`] waits for a whole exchange by default.
pub(crate) const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// Nesting deeper than this is rejected rather than risking the stack.
const MAX_DEPTH: usize = 64;

/// One RESP2 reply.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RespValue {
    /// A simple string, e.g. `+OK`.
    Simple(String),
    /// An error reply, e.g. `-WRONGTYPE ...` (without the leading `-`).
    Error(String),
    /// An integer, e.g. `:42`.
    Int(i64),
    /// A bulk string; `None` is the nil bulk string `$-1`.
    Bulk(Option<Vec<u8>>),
    /// An array; `None` is the nil array `*-1`.
    Array(Option<Vec<RespValue>>),
}

impl RespValue {
    /// The integer, if this is an [`Int`](RespValue::Int).
    pub fn as_int(&self) -> Option<i64> {
        match self {
            RespValue::Int(i) => Some(*i),
            _ => None,
        }
    }

    /// The text of a [`Simple`](RespValue::Simple) string, or of a
    /// non-nil [`Bulk`](RespValue::Bulk) string that is valid UTF-8.
    /// Errors are not strings: see [`as_error`](RespValue::as_error).
    pub fn as_str(&self) -> Option<&str> {
        match self {
            RespValue::Simple(s) => Some(s),
            RespValue::Bulk(Some(b)) => std::str::from_utf8(b).ok(),
            _ => None,
        }
    }

    /// The bytes of a non-nil [`Bulk`](RespValue::Bulk) string or of a
    /// [`Simple`](RespValue::Simple) string.
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            RespValue::Simple(s) => Some(s.as_bytes()),
            RespValue::Bulk(Some(b)) => Some(b),
            _ => None,
        }
    }

    /// The elements of a non-nil [`Array`](RespValue::Array).
    pub fn as_array(&self) -> Option<&[RespValue]> {
        match self {
            RespValue::Array(Some(items)) => Some(items),
            _ => None,
        }
    }

    /// The message of an [`Error`](RespValue::Error) reply.
    pub fn as_error(&self) -> Option<&str> {
        match self {
            RespValue::Error(e) => Some(e),
            _ => None,
        }
    }

    /// Whether this is an [`Error`](RespValue::Error) reply.
    pub fn is_error(&self) -> bool {
        matches!(self, RespValue::Error(_))
    }

    /// Whether this is the nil bulk string or the nil array.
    pub fn is_nil(&self) -> bool {
        matches!(self, RespValue::Bulk(None) | RespValue::Array(None))
    }

    /// Parses one reply from the start of `buf`.
    ///
    /// Returns `Ok(None)` if `buf` holds only part of a reply, or the reply
    /// and the number of bytes it took. Malformed input is an error whose
    /// text describes the problem.
    pub fn parse(buf: &[u8]) -> Result<Option<(RespValue, usize)>, String> {
        parse_at(buf, 0, 0)
    }
}

/// Encodes a command as a RESP2 array of bulk strings.
pub fn encode_command<A: AsRef<[u8]>>(args: &[A]) -> Vec<u8> {
    let mut out =
        Vec::with_capacity(16 + args.iter().map(|a| a.as_ref().len() + 16).sum::<usize>());
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for arg in args {
        let arg = arg.as_ref();
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// Sends one command to `addr` over a fresh TCP connection and returns its
/// reply. Gives up after 10 seconds.
///
/// Error replies are returned as [`RespValue::Error`], not as `Err`.
pub async fn send_command(addr: SocketAddr, args: &[&str]) -> Result<RespValue, TestkitError> {
    let mut replies = exchange(addr, &[args.to_vec()], COMMAND_TIMEOUT).await?;
    replies.pop().ok_or_else(|| TestkitError::Protocol {
        addr,
        detail: "no reply".to_owned(),
    })
}

/// Sends `commands` pipelined over one fresh connection and returns one reply per command, in
/// order. Gives up after 10 seconds. A `MULTI` … `EXEC` sequence runs as one transaction, so the
/// commands between them run back to back in the server, with no client or network time between
/// them.
///
/// Error replies are returned as [`RespValue::Error`], not as `Err`.
pub async fn send_commands(
    addr: SocketAddr,
    commands: &[Vec<&str>],
) -> Result<Vec<RespValue>, TestkitError> {
    exchange(addr, commands, COMMAND_TIMEOUT).await
}

/// Sends `commands` pipelined over one fresh connection and reads one reply
/// per command, all within `timeout`.
pub(crate) async fn exchange(
    addr: SocketAddr,
    commands: &[Vec<&str>],
    timeout: Duration,
) -> Result<Vec<RespValue>, TestkitError> {
    match tokio::time::timeout(timeout, exchange_inner(addr, commands)).await {
        Ok(result) => result,
        Err(_) => Err(TestkitError::CommandTimeout { addr, timeout }),
    }
}

/// As [`exchange`], over the Unix socket at `path` of the server known as `addr` (a TLS-only
/// server's plain-text side door for the kit: its TCP port speaks only TLS).
pub(crate) async fn exchange_unix(
    path: &Path,
    addr: SocketAddr,
    commands: &[Vec<&str>],
    timeout: Duration,
) -> Result<Vec<RespValue>, TestkitError> {
    let exchange = async {
        let stream = UnixStream::connect(path)
            .await
            .map_err(|e| TestkitError::io(format!("connecting to {}", path.display()), e))?;
        exchange_on(stream, addr, commands).await
    };
    match tokio::time::timeout(timeout, exchange).await {
        Ok(result) => result,
        Err(_) => Err(TestkitError::CommandTimeout { addr, timeout }),
    }
}

async fn exchange_inner(
    addr: SocketAddr,
    commands: &[Vec<&str>],
) -> Result<Vec<RespValue>, TestkitError> {
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|e| TestkitError::io(format!("connecting to {addr}"), e))?;
    exchange_on(stream, addr, commands).await
}

async fn exchange_on<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    addr: SocketAddr,
    commands: &[Vec<&str>],
) -> Result<Vec<RespValue>, TestkitError> {
    let mut request = Vec::new();
    for command in commands {
        request.extend_from_slice(&encode_command(command));
    }
    stream
        .write_all(&request)
        .await
        .map_err(|e| TestkitError::io(format!("sending a command to {addr}"), e))?;

    let mut replies = Vec::with_capacity(commands.len());
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    while replies.len() < commands.len() {
        match RespValue::parse(&buf) {
            Ok(Some((value, used))) => {
                buf.drain(..used);
                replies.push(value);
                continue;
            }
            Ok(None) => {}
            Err(detail) => return Err(TestkitError::Protocol { addr, detail }),
        }
        let n = stream
            .read(&mut chunk)
            .await
            .map_err(|e| TestkitError::io(format!("reading a reply from {addr}"), e))?;
        if n == 0 {
            return Err(TestkitError::ConnectionClosed { addr });
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Ok(replies)
}

/// Parses one value starting at `pos`; returns it and the position after it.
fn parse_at(buf: &[u8], pos: usize, depth: usize) -> Result<Option<(RespValue, usize)>, String> {
    if depth > MAX_DEPTH {
        return Err(format!("reply nested deeper than {MAX_DEPTH} levels"));
    }
    let Some((line, after_line)) = read_line(buf, pos) else {
        return Ok(None);
    };
    let Some((&kind, rest)) = line.split_first() else {
        return Err("empty reply line".to_owned());
    };
    let text = || {
        std::str::from_utf8(rest)
            .map(str::to_owned)
            .map_err(|_| "reply line is not UTF-8".to_owned())
    };
    match kind {
        b'+' => Ok(Some((RespValue::Simple(text()?), after_line))),
        b'-' => Ok(Some((RespValue::Error(text()?), after_line))),
        b':' => Ok(Some((RespValue::Int(parse_int(rest)?), after_line))),
        b'$' => {
            let len = parse_int(rest)?;
            if len < 0 {
                return Ok(Some((RespValue::Bulk(None), after_line)));
            }
            let len = usize::try_from(len).map_err(|_| format!("bulk length {len} too large"))?;
            let end = after_line
                .checked_add(len)
                .ok_or_else(|| format!("bulk length {len} too large"))?;
            if buf.len() < end.saturating_add(2) {
                return Ok(None);
            }
            if &buf[end..end + 2] != b"\r\n" {
                return Err("bulk string not terminated by CRLF".to_owned());
            }
            let data = buf[after_line..end].to_vec();
            Ok(Some((RespValue::Bulk(Some(data)), end + 2)))
        }
        b'*' => {
            let count = parse_int(rest)?;
            if count < 0 {
                return Ok(Some((RespValue::Array(None), after_line)));
            }
            let count =
                usize::try_from(count).map_err(|_| format!("array length {count} too large"))?;
            // Every element takes at least 3 bytes, so this bounds the allocation.
            let mut items = Vec::with_capacity(count.min(buf.len() / 3 + 1));
            let mut at = after_line;
            for _ in 0..count {
                match parse_at(buf, at, depth + 1)? {
                    Some((item, next)) => {
                        items.push(item);
                        at = next;
                    }
                    None => return Ok(None),
                }
            }
            Ok(Some((RespValue::Array(Some(items)), at)))
        }
        other => Err(format!("unknown RESP2 type byte {:?}", char::from(other))),
    }
}

/// The line starting at `pos` without its CRLF, and the position after it.
fn read_line(buf: &[u8], pos: usize) -> Option<(&[u8], usize)> {
    let rest = buf.get(pos..)?;
    let idx = rest.windows(2).position(|w| w == b"\r\n")?;
    Some((&rest[..idx], pos + idx + 2))
}

fn parse_int(digits: &[u8]) -> Result<i64, String> {
    std::str::from_utf8(digits)
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .ok_or_else(|| format!("invalid integer {:?}", String::from_utf8_lossy(digits)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(input: &[u8]) -> RespValue {
        let (value, used) = RespValue::parse(input).unwrap().unwrap();
        assert_eq!(used, input.len());
        value
    }

    #[test]
    fn parses_every_type() {
        assert_eq!(parse_all(b"+OK\r\n"), RespValue::Simple("OK".into()));
        assert_eq!(
            parse_all(b"-ERR bad\r\n"),
            RespValue::Error("ERR bad".into())
        );
        assert_eq!(parse_all(b":-7\r\n"), RespValue::Int(-7));
        assert_eq!(
            parse_all(b"$3\r\na\r\n\r\n"),
            RespValue::Bulk(Some(b"a\r\n".to_vec()))
        );
        assert_eq!(parse_all(b"$0\r\n\r\n"), RespValue::Bulk(Some(Vec::new())));
        assert!(parse_all(b"$-1\r\n").is_nil());
        assert!(parse_all(b"*-1\r\n").is_nil());
        assert_eq!(parse_all(b"*0\r\n"), RespValue::Array(Some(Vec::new())));
        assert_eq!(
            parse_all(b"*2\r\n:1\r\n*1\r\n$1\r\nx\r\n"),
            RespValue::Array(Some(vec![
                RespValue::Int(1),
                RespValue::Array(Some(vec![RespValue::Bulk(Some(b"x".to_vec()))])),
            ]))
        );
    }

    #[test]
    fn incomplete_input_asks_for_more() {
        let full = b"*2\r\n$5\r\nhello\r\n:12\r\n";
        for cut in 0..full.len() {
            assert_eq!(
                RespValue::parse(&full[..cut]).unwrap(),
                None,
                "cut at {cut}"
            );
        }
        assert!(RespValue::parse(full).unwrap().is_some());
    }

    #[test]
    fn malformed_input_is_an_error() {
        assert!(RespValue::parse(b"?x\r\n").is_err());
        assert!(RespValue::parse(b":abc\r\n").is_err());
        assert!(RespValue::parse(b"$1\r\nabc\r\n").is_err());
        assert!(RespValue::parse(b"\r\n").is_err());
        let deep = "*1\r\n".repeat(MAX_DEPTH + 2);
        assert!(RespValue::parse(deep.as_bytes()).is_err());
    }

    #[test]
    fn helpers() {
        assert_eq!(RespValue::Int(3).as_int(), Some(3));
        assert_eq!(RespValue::Simple("a".into()).as_str(), Some("a"));
        assert_eq!(RespValue::Bulk(Some(b"b".to_vec())).as_str(), Some("b"));
        assert_eq!(RespValue::Bulk(Some(vec![0xff])).as_str(), None);
        assert_eq!(RespValue::Error("E".into()).as_str(), None);
        assert_eq!(RespValue::Error("E".into()).as_error(), Some("E"));
        assert!(!RespValue::Bulk(Some(Vec::new())).is_nil());
    }

    #[test]
    fn encodes_commands() {
        assert_eq!(
            encode_command(&["SET", "k", ""]),
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n"
        );
    }
}
