//! Helpers shared by the integration tests: a raw RESP connection.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use lockkit_testkit::{encode_command, RespValue};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Guards against hangs only; never a performance assertion.
pub const HANG_GUARD: Duration = Duration::from_secs(10);

/// A raw client connection that keeps unparsed bytes between replies.
pub struct Conn {
    pub stream: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    pub async fn connect(addr: SocketAddr) -> Conn {
        let stream = tokio::time::timeout(HANG_GUARD, TcpStream::connect(addr))
            .await
            .expect("connect timed out")
            .expect("connect failed");
        Conn {
            stream,
            buf: Vec::new(),
        }
    }

    pub async fn send(&mut self, args: &[&str]) {
        self.stream
            .write_all(&encode_command(args))
            .await
            .expect("write failed");
    }

    /// Reads one reply.
    pub async fn reply(&mut self) -> RespValue {
        tokio::time::timeout(HANG_GUARD, self.reply_inner())
            .await
            .expect("reply timed out")
    }

    async fn reply_inner(&mut self) -> RespValue {
        loop {
            if let Some((value, used)) = RespValue::parse(&self.buf).expect("bad reply") {
                self.buf.drain(..used);
                return value;
            }
            let mut chunk = [0u8; 4096];
            let n = self.stream.read(&mut chunk).await.expect("read failed");
            assert!(n > 0, "connection closed while waiting for a reply");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    pub async fn command(&mut self, args: &[&str]) -> RespValue {
        self.send(args).await;
        self.reply().await
    }

    /// Asserts that the peer closes the connection without sending anything.
    pub async fn expect_closed(&mut self) {
        assert!(self.buf.is_empty(), "unread bytes: {:?}", self.buf);
        let mut rest = Vec::new();
        let read = tokio::time::timeout(HANG_GUARD, self.stream.read_to_end(&mut rest))
            .await
            .expect("connection was not closed");
        if let Err(err) = read {
            // A reset is a close too.
            assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");
        }
        assert!(rest.is_empty(), "got bytes before the close: {rest:?}");
    }

    /// Whether a reply arrives within `wait`. Only used to check that none
    /// does while something is paused: a paused peer cannot answer, so this
    /// cannot flake whatever the machine's speed.
    pub async fn reply_within(&mut self, wait: Duration) -> Option<RespValue> {
        tokio::time::timeout(wait, self.reply_inner()).await.ok()
    }
}

pub fn bulk(s: &str) -> RespValue {
    RespValue::Bulk(Some(s.as_bytes().to_vec()))
}

pub fn simple(s: &str) -> RespValue {
    RespValue::Simple(s.to_owned())
}

pub fn nil() -> RespValue {
    RespValue::Bulk(None)
}
