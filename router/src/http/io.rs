//! A connection's socket as hyper sees it: bytes read are reported to the connection's
//! [`Activity`], and a write that stays blocked for `--http-write-timeout` fails.
//!
//! A blocked write means the client's socket buffers are full: it reads nothing. Failing
//! the write makes hyper drop the connection and with it the answer's body, which cancels
//! the request in the scheduler and frees its slot; without it, a stream nobody reads kept
//! its slot and its buffered events for as long as the client kept the connection.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

use super::activity::Activity;

pub struct GuardedIo<T> {
    inner: T,
    activity: Arc<Activity>,
    write_timeout: Duration,
    /// Runs while a write is blocked; reset by any write that goes through.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<T> GuardedIo<T> {
    pub fn new(inner: T, activity: Arc<Activity>, write_timeout: Duration) -> Self {
        Self {
            inner,
            activity,
            write_timeout,
            stalled: None,
        }
    }

    /// After the inner write returned `Pending`: fails once it has been blocked too long.
    fn poll_stall<R>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<R>> {
        let timeout = self.write_timeout;
        let stall = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        ready!(stall.as_mut().poll(cx));
        metrics::counter!(crate::metrics::HTTP_TIMEOUTS, "kind" => "write").increment(1);
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("the client read nothing for {timeout:?} (--http-write-timeout)"),
        )))
    }

    /// The result of an inner write: a blocked one runs the stall clock, any other stops it.
    fn guard<R>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<R>>,
    ) -> Poll<io::Result<R>> {
        match polled {
            Poll::Pending => self.poll_stall(cx),
            done => {
                self.stalled = None;
                done
            }
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for GuardedIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        if buf.filled().len() > before {
            this.activity.read_some();
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for GuardedIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.guard(cx, polled)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.guard(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_flush(cx);
        this.guard(cx, polled)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_shutdown(cx);
        this.guard(cx, polled)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    fn guarded(inner: tokio::io::DuplexStream) -> GuardedIo<tokio::io::DuplexStream> {
        GuardedIo::new(inner, Arc::new(Activity::new()), Duration::from_secs(3))
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_blocked_past_the_timeout_fails() {
        let (server, _client) = tokio::io::duplex(64);
        let mut io = guarded(server);
        let started = tokio::time::Instant::now();
        let err = io.write_all(&[0; 1024]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_reader_that_keeps_reading_is_served() {
        let (server, mut client) = tokio::io::duplex(64);
        let mut io = guarded(server);
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            let mut chunk = [0; 64];
            loop {
                // Slower than the buffer fills, but never as slow as the timeout.
                tokio::time::sleep(Duration::from_secs(2)).await;
                match client.read(&mut chunk).await.unwrap() {
                    0 => return got,
                    n => got.extend_from_slice(&chunk[..n]),
                }
            }
        });
        io.write_all(&[7; 1024]).await.unwrap();
        io.shutdown().await.unwrap();
        assert_eq!(reader.await.unwrap(), vec![7; 1024]);
    }
}
