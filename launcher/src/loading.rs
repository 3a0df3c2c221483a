//! The HTTP port while the model downloads and the shards load.
//!
//! The router answers 503 while it starts, but the launcher starts it only once the shards
//! are ready, and a download from `gs://` or the Hub comes before that: minutes with
//! nothing on the port, which a platform's health probe sees as a refused connection —
//! a dead container. So the launcher binds the port first thing and answers every request
//! itself, 503 in the router's words, until the shards are ready. Then the same socket is
//! handed to the router (`--listen-fd`): connections that arrive meanwhile wait in its
//! backlog for the router to accept them, and at no moment does the port refuse.

use std::net::TcpListener as StdListener;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use nix::fcntl::{fcntl, FcntlArg, FdFlag};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, Semaphore};
use tokio::task::JoinHandle;

/// The router's own answer while it starts (`ApiError::NotReady`: its envelope, its
/// sentence), so a client sees one answer whichever process gives it.
pub fn loading_body() -> String {
    serde_json::json!({"error": sonde_common::LOADING_MESSAGE, "error_type": "healthcheck"})
        .to_string()
}

/// Largest request head read before answering; the answer is the same whatever it says.
const MAX_HEAD_BYTES: usize = 16 * 1024;
/// Time a client gets to send its request head, and to read the answer.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections given `CLIENT_TIMEOUT` at once. Past it, a connection gets `BUSY_TIMEOUT`:
/// clients that send nothing (a slowloris) hold few descriptors for long, and a health
/// probe, which sends its request at once, still hears 503.
const MAX_ANSWERING: usize = 256;
const BUSY_TIMEOUT: Duration = Duration::from_millis(200);

/// Answers 503 on the HTTP port until [`Loading::hand_over`].
pub struct Loading {
    stop: oneshot::Sender<()>,
    task: JoinHandle<TcpListener>,
}

impl Loading {
    /// Starts answering on `listener` (bound, not yet accepting).
    pub fn serve(listener: StdListener) -> std::io::Result<Self> {
        listener.set_nonblocking(true)?;
        let listener = TcpListener::from_std(listener)?;
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(accept_until(listener, stopped));
        Ok(Self { stop, task })
    }

    /// Stops accepting and returns the socket, still listening, made inheritable by the
    /// next process the launcher starts (the router), with its descriptor number. The
    /// caller drops it once that process started, so no later child inherits it.
    pub async fn hand_over(self) -> std::io::Result<(StdListener, RawFd)> {
        let _ = self.stop.send(());
        let listener = self
            .task
            .await
            .map_err(|e| std::io::Error::other(format!("the loading responder failed: {e}")))?
            .into_std()?;
        fcntl(&listener, FcntlArg::F_SETFD(FdFlag::empty())).map_err(std::io::Error::from)?;
        let fd = listener.as_raw_fd();
        Ok((listener, fd))
    }
}

async fn accept_until(listener: TcpListener, mut stop: oneshot::Receiver<()>) -> TcpListener {
    let answering = std::sync::Arc::new(Semaphore::new(MAX_ANSWERING));
    loop {
        tokio::select! {
            biased;
            _ = &mut stop => return listener,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let permit = answering.clone().try_acquire_owned().ok();
                    let patience = if permit.is_some() { CLIENT_TIMEOUT } else { BUSY_TIMEOUT };
                    tokio::spawn(async move {
                        answer(stream, patience).await;
                        drop(permit);
                    });
                }
                Err(e) => {
                    // Out of descriptors, or a connection reset before it was accepted:
                    // the next accept may work, and the port must stay up meanwhile.
                    tracing::debug!(error = %e, "accepting a connection while loading");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
}

/// Reads the request head, answers 503 and closes, giving the client `patience` for each.
async fn answer(mut stream: TcpStream, patience: Duration) {
    let _ = tokio::time::timeout(patience, read_head(&mut stream)).await;
    sonde_common::http::answer_503_and_close(&mut stream, &loading_body(), patience).await;
}

async fn read_head(stream: &mut TcpStream) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while head.len() < MAX_HEAD_BYTES {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
        if head.windows(4).any(|w| w == b"\r\n\r\n") {
            break;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::io::{Read, Write};

    fn get(addr: std::net::SocketAddr, request: &str) -> String {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn answers_503_in_the_routers_words_on_every_route() {
        let listener = StdListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let loading = Loading::serve(listener).unwrap();
        for request in [
            "GET /health HTTP/1.1\r\nhost: x\r\n\r\n",
            "POST /generate HTTP/1.1\r\ncontent-length: 13\r\n\r\n{\"inputs\":\"\"}",
        ] {
            let out = tokio::task::spawn_blocking({
                let request = request.to_string();
                move || get(addr, &request)
            })
            .await
            .unwrap();
            assert!(out.starts_with("HTTP/1.1 503 "), "{out}");
            assert!(out.ends_with(&loading_body()), "{out}");
        }
        loading.hand_over().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn clients_that_send_nothing_do_not_silence_the_port() {
        let listener = StdListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let loading = Loading::serve(listener).unwrap();
        let silent: Vec<_> = (0..MAX_ANSWERING + 20)
            .map(|_| std::net::TcpStream::connect(addr).unwrap())
            .collect();
        let out = tokio::task::spawn_blocking(move || {
            get(addr, "GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        })
        .await
        .unwrap();
        assert!(out.starts_with("HTTP/1.1 503 "), "{out}");
        // The first MAX_ANSWERING still wait for their request; the rest were answered and
        // closed within a fraction of a second: they hold no descriptor.
        let (waiting, answered) = tokio::task::spawn_blocking(move || {
            let read = |mut s: &std::net::TcpStream| {
                s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
                let mut out = String::new();
                s.read_to_string(&mut out).map(|_| out)
            };
            (read(&silent[0]), read(&silent[MAX_ANSWERING + 19]))
        })
        .await
        .unwrap();
        assert!(waiting.is_err(), "{waiting:?}");
        assert!(answered.unwrap().starts_with("HTTP/1.1 503 "));
        loading.hand_over().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn handed_over_socket_keeps_the_connections_that_arrive_meanwhile() {
        let listener = StdListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let loading = Loading::serve(listener).unwrap();
        let (listener, fd) = loading.hand_over().await.unwrap();
        assert_eq!(fd, listener.as_raw_fd());
        let flags = fcntl(&listener, FcntlArg::F_GETFD).unwrap();
        assert_eq!(
            flags & libc_cloexec(),
            0,
            "the socket would not survive exec"
        );
        // Nobody accepts now, yet the connection is taken (the backlog) and served by
        // whoever accepts next: the router, in production.
        let client = std::thread::spawn(move || get(addr, "GET /health HTTP/1.1\r\n\r\n"));
        listener.set_nonblocking(false).unwrap();
        let (mut conn, _) = listener.accept().unwrap();
        let mut head = [0u8; 64];
        let n = conn.read(&mut head).unwrap();
        assert!(head[..n].starts_with(b"GET /health"));
        conn.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            .unwrap();
        drop(conn);
        assert!(client.join().unwrap().starts_with("HTTP/1.1 200 OK"));
    }

    fn libc_cloexec() -> i32 {
        FdFlag::FD_CLOEXEC.bits()
    }
}
