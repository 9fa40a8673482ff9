//! HTTP/1.0 WebSocket upgrades, served as Node's `http` and `ws` serve them.
//!
//! hyper upgrades only HTTP/1.1 requests; an HTTP/1.0 `Upgrade` request is answered and the
//! connection closed. Node's parser reports the upgrade whatever the version and `ws`
//! completes the handshake, so Aphlict serves such a client. [`Http10AsHttp11`] reads the
//! connection's first request line `… HTTP/1.0` as `… HTTP/1.1` (one byte, same length) and
//! says so in a [`WasHttp10`] request extension, so a handler that does not take the
//! connection over can still close it after its answer as HTTP/1.0 expects.
//!
//! Only a request line that arrives whole in the first read is looked at (clients send
//! their head in one write, far smaller than a segment); otherwise nothing changes.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Request extension: the request came as HTTP/1.0 and is handled as HTTP/1.1.
#[derive(Debug, Clone, Copy)]
pub struct WasHttp10;

/// A stream whose first request line's `HTTP/1.0` reads as `HTTP/1.1`.
#[derive(Debug)]
pub struct Http10AsHttp11<S> {
    inner: S,
    looked: bool,
    patched: Arc<AtomicBool>,
}

impl<S> Http10AsHttp11<S> {
    /// Wraps `inner`; nothing has been read yet. When `enabled` is false, reads pass
    /// through untouched (every listener's connections have this one type).
    pub fn new(inner: S, enabled: bool) -> Self {
        Http10AsHttp11 {
            inner,
            looked: !enabled,
            patched: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The stream, for a handler that took the connection over.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// Set once the first request line was patched.
    pub(crate) fn patched_flag(&self) -> Arc<AtomicBool> {
        self.patched.clone()
    }
}

/// Patches `head` in place when its first line ends in ` HTTP/1.0`; whether it did.
fn patch_first_line(head: &mut [u8]) -> bool {
    let Some(end) = head.iter().position(|&b| b == b'\n') else {
        return false;
    };
    let line_end = if end > 0 && head[end - 1] == b'\r' {
        end - 1
    } else {
        end
    };
    if line_end >= 9 && &head[line_end - 9..line_end] == b" HTTP/1.0" {
        head[line_end - 1] = b'1';
        return true;
    }
    false
}

impl<S: AsyncRead + Unpin> AsyncRead for Http10AsHttp11<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if !self.looked && matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.looked = true;
            if patch_first_line(&mut buf.filled_mut()[before..]) {
                self.patched.store(true, Ordering::Relaxed);
            }
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Http10AsHttp11<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_first_line_ending_in_http_1_0_is_patched() {
        let mut head = b"GET /~a/ HTTP/1.0\r\nUpgrade: websocket\r\n\r\n".to_vec();
        assert!(patch_first_line(&mut head));
        assert_eq!(&head[..19], b"GET /~a/ HTTP/1.1\r\n");
        let mut bare = b"GET / HTTP/1.0\nHost: x\n\n".to_vec();
        assert!(patch_first_line(&mut bare));
        assert_eq!(&bare[..15], b"GET / HTTP/1.1\n");
        for unchanged in [
            &b"GET / HTTP/1.1\r\n\r\n"[..],
            b"GET / HTTP/1.0",
            b"GET /HTTP/1.0\r\n",
            b"GET / HTTP/1.1\r\nX: HTTP/1.0\r\n",
        ] {
            let mut copy = unchanged.to_vec();
            assert!(!patch_first_line(&mut copy));
            assert_eq!(copy, unchanged);
        }
    }
}
