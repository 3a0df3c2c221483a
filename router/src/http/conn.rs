//! One connection: served by hyper (HTTP/1.1, or HTTP/2 with prior knowledge) until the
//! client closes it, it waits past a limit, or the server shuts down.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use axum::Router;
use http_body_util::BodyExt;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::activity::Activity;
use super::io::GuardedIo;
use super::HttpLimits;
use crate::error::ApiError;
use crate::metrics as m;

/// The time limits a request's handler enforces itself (the body's), found in the
/// request's extensions.
#[derive(Debug, Clone, Copy)]
pub struct BodyTimeout(pub Duration);

pub async fn serve(
    stream: TcpStream,
    app: Router,
    limits: HttpLimits,
    mut stop: watch::Receiver<bool>,
) {
    // Answers are written as they come (SSE events, one token each).
    let _ = stream.set_nodelay(true);
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(GuardedIo::new(
        stream,
        activity.clone(),
        limits.write_timeout,
    ));
    let tracked = activity.clone();
    let service = hyper::service::service_fn(move |mut request: Request<hyper::body::Incoming>| {
        let (app, activity) = (app.clone(), tracked.clone());
        request
            .extensions_mut()
            .insert(BodyTimeout(limits.body_timeout));
        async move {
            activity.request_started();
            let ended = RequestEnd(activity);
            // A Router is always ready: no `poll_ready` needed before `call`.
            let mut app = app;
            let response = tower::Service::call(&mut app, request.map(Body::new)).await?;
            Ok::<_, std::convert::Infallible>(until_written(response, ended))
        }
    });
    let builder = auto::Builder::new(TokioExecutor::new());
    let connection = builder.serve_connection(io, service);
    let mut connection = std::pin::pin!(connection);
    let mut stopping = false;
    loop {
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            why = activity.expired(&limits) => {
                metrics::counter!(m::HTTP_TIMEOUTS, "kind" => why.label()).increment(1);
                tracing::debug!(kind = why.label(), "closing a connection its client left waiting");
                return;
            }
            _ = stop.changed(), if !stopping => {
                // Also when the server is gone without a word: stop all the same.
                stopping = true;
                connection.as_mut().graceful_shutdown();
            }
        }
    }
}

/// Marks the end of a request on the connection when dropped: with the answer's body,
/// once written or abandoned.
struct RequestEnd(Arc<Activity>);

impl Drop for RequestEnd {
    fn drop(&mut self) {
        self.0.request_ended();
    }
}

/// The answer, whose body carries `ended` until hyper drops it.
fn until_written(response: Response, ended: RequestEnd) -> Response {
    response.map(|body| {
        Body::new(body.map_frame(move |frame| {
            let _ = &ended;
            frame
        }))
    })
}

/// Answers a connection over `--max-connections` with a 503 and closes it.
pub async fn refuse(mut stream: TcpStream, max_connections: usize) {
    // The envelope every error has; no router is behind this connection to answer it.
    let error = ApiError::Overloaded(format!(
        "the server has its --max-connections ({max_connections}) connections open; retry later"
    ));
    let body = serde_json::to_string(&error.body()).unwrap_or_default();
    sonde_common::http::answer_503_and_close(&mut stream, &body, Duration::from_secs(2)).await;
}
