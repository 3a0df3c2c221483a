#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The HTTP server's connection limits over real sockets: slow headers, an idle keep-alive
//! connection, a trickled body, a client that reads nothing, one connection too many.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::routing::get;
use axum::Router;
use common::*;
use sonde_router::http::{serve, HttpLimits};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

fn limits() -> HttpLimits {
    config().http
}

/// Serves `app` on a free port under `limits`; the server stops with the test.
async fn start(app: Router, limits: HttpLimits) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(listener, app, limits, std::future::pending()));
    addr
}

async fn full_app() -> std::net::SocketAddr {
    start(app_with(config(), &FakeBackend::default()), limits()).await
}

/// Reads until the server closes the connection; what it sent, and when it closed.
async fn read_to_close(stream: &mut TcpStream, within: Duration) -> (String, Duration) {
    let started = Instant::now();
    let mut got = Vec::new();
    let read = tokio::time::timeout(within, stream.read_to_end(&mut got)).await;
    // A reset is a close too.
    assert!(read.is_ok(), "still open after {within:?}");
    (
        String::from_utf8_lossy(&got).into_owned(),
        started.elapsed(),
    )
}

const HEALTH: &[u8] = b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n";

#[tokio::test]
async fn headers_trickled_line_by_line_are_cut_at_the_header_timeout() {
    let addr = full_app().await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let started = Instant::now();
    stream.write_all(b"GET /health HTTP/1.1\r\n").await.unwrap();
    // One header line every half second: each byte is progress, but the headers never end.
    let trickle = async {
        for i in 0.. {
            tokio::time::sleep(Duration::from_millis(500)).await;
            if stream
                .write_all(format!("x-{i}: y\r\n").as_bytes())
                .await
                .is_err()
            {
                return;
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(10), trickle).await;
    let closed_after = started.elapsed();
    let header = limits().header_timeout;
    assert!(
        closed_after >= header && closed_after < header + Duration::from_secs(2),
        "closed after {closed_after:?}, the header timeout is {header:?}"
    );
}

#[tokio::test]
async fn a_silent_new_connection_is_closed_at_the_header_timeout() {
    let addr = full_app().await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let (_, after) = read_to_close(&mut stream, Duration::from_secs(10)).await;
    let header = limits().header_timeout;
    assert!(after >= header - Duration::from_millis(100), "{after:?}");
}

#[tokio::test]
async fn an_idle_keep_alive_connection_lives_until_the_idle_timeout() {
    let addr = full_app().await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(HEALTH).await.unwrap();
    let mut buf = [0u8; 4096];
    let n = stream.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    let (_, after) = read_to_close(&mut stream, Duration::from_secs(10)).await;
    let idle = limits().idle_timeout;
    // Longer than the header timeout: an idle connection is not a slow header.
    assert!(idle > limits().header_timeout);
    assert!(
        after >= idle - Duration::from_millis(200) && after < idle + Duration::from_secs(2),
        "closed after {after:?}, the idle timeout is {idle:?}"
    );
    // And while it was open, it served a second request: checked by the next test.
}

#[tokio::test]
async fn a_keep_alive_connection_serves_request_after_request() {
    let addr = full_app().await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    for _ in 0..3 {
        stream.write_all(HEALTH).await.unwrap();
        let mut buf = [0u8; 4096];
        let n = stream.read(&mut buf).await.unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
        // Each pause is under the idle timeout but adds up to more than it.
        tokio::time::sleep(limits().idle_timeout / 2).await;
    }
}

#[tokio::test]
async fn a_body_that_stops_halfway_gets_408_at_the_body_timeout() {
    let addr = full_app().await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let started = Instant::now();
    stream
        .write_all(
            b"POST /generate HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
              content-length: 100\r\n\r\n{\"inputs\": ",
        )
        .await
        .unwrap();
    let (answer, _) = read_to_close(&mut stream, Duration::from_secs(10)).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        answer.contains("\"error_type\":\"request_timeout\""),
        "{answer}"
    );
    assert!(answer.contains("--http-body-timeout"), "{answer}");
    let body = limits().body_timeout;
    assert!(started.elapsed() >= body, "{:?}", started.elapsed());
}

#[tokio::test]
async fn a_client_that_reads_nothing_is_dropped_and_its_answer_abandoned() {
    let dropped = Arc::new(AtomicBool::new(false));
    let flag = dropped.clone();
    // An endless answer: only the client's reading could slow it.
    let app = Router::new().route(
        "/endless",
        get(move || {
            let guard = SetOnDrop(flag.clone());
            async move {
                let chunks = futures::stream::repeat_with(move || {
                    let _ = &guard;
                    Ok::<_, std::io::Error>(Bytes::from(vec![b'x'; 64 * 1024]))
                });
                Body::from_stream(chunks)
            }
        }),
    );
    let addr = start(app, limits()).await;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /endless HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    // Never read: the socket buffers fill and the server's writes block.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !dropped.load(Ordering::SeqCst) {
        assert!(
            Instant::now() < deadline,
            "the answer is still being written"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(stream);
}

/// Sets its flag when the answer's stream is dropped.
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[tokio::test]
async fn one_connection_over_the_limit_gets_503_and_the_others_are_served() {
    let limits = HttpLimits {
        max_connections: 2,
        ..limits()
    };
    let addr = start(app_with(config(), &FakeBackend::default()), limits).await;
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(TcpStream::connect(addr).await.unwrap());
    }
    // Let the server accept both before the third arrives.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut third = TcpStream::connect(addr).await.unwrap();
    third.write_all(HEALTH).await.unwrap();
    let (answer, _) = read_to_close(&mut third, Duration::from_secs(5)).await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("\"error_type\":\"overloaded\""), "{answer}");
    assert!(answer.contains("--max-connections (2)"), "{answer}");
    // The held connections are served.
    let first = &mut held[0];
    first.write_all(HEALTH).await.unwrap();
    let mut buf = [0u8; 4096];
    let n = first.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    // Once one closes, a new connection is served again.
    drop(held);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut again = TcpStream::connect(addr).await.unwrap();
    again.write_all(HEALTH).await.unwrap();
    let n = again.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
}
