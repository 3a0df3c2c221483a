//! A connection that no HTTP server will serve: answered 503 by hand and closed. The
//! router does this past `--max-connections`, the launcher while the model loads.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Writes a whole `503 Service Unavailable` answer carrying `body` (a JSON error), closes
/// the writing side and reads whatever the client still sends until it closes, giving up
/// after `within`. Reading before closing matters: closing a socket with unread bytes
/// resets the connection, and the client could lose the answer.
pub async fn answer_503_and_close(stream: &mut TcpStream, body: &str, within: Duration) {
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(within, async {
        stream.write_all(answer.as_bytes()).await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 4096];
        while stream.read(&mut sink).await? > 0 {}
        Ok::<_, std::io::Error>(())
    })
    .await;
}
