//! The accept loop: HTTP/1.1 connections with a deadline for their request headers and
//! a cap on how many are open at once, so slow or idle clients cannot pin the server.
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

/// Longest a client may take to send a request's headers (the first request of a
/// connection, or the next one on a kept-alive connection) before the connection is
/// closed.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest a request body may stall between two chunks before the request fails.
pub const BODY_STALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Most connections open at once; further clients wait in the listen backlog.
pub const MAX_CONNECTIONS: usize = 4096;

/// Serve `app` on `listener` until `shutdown` fires, then let each connection finish
/// its request in flight and wait for all of them.
pub(crate) async fn serve_connections(
    listener: tokio::net::TcpListener,
    app: Router,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let connections = TaskTracker::new();
    loop {
        let permit = tokio::select! {
            permit = Arc::clone(&permits).acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break, // never closed
            },
            () = shutdown.cancelled() => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors, or a connection reset before accept: wait
                    // a moment instead of spinning, and keep serving.
                    tracing::warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => break,
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(
            app.clone()
                .map_request(|request: Request<Incoming>| request.map(Body::new)),
        );
        let shutdown = shutdown.clone();
        connections.spawn(async move {
            let _permit = permit;
            let mut builder = http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT);
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            let mut connection = std::pin::pin!(connection);
            tokio::select! {
                result = connection.as_mut() => {
                    if let Err(e) = result {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
                }
                () = shutdown.cancelled() => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
        });
    }
    drop(listener);
    connections.close();
    connections.wait().await;
    Ok(())
}
