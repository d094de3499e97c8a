//! The `/metrics` endpoint: HTTP/1.1 (hyper) on a listener of its own, so a scrape
//! never queues behind RPCs and the RPC port speaks only the authenticated protocol.
//! `GET /metrics` answers the exposition (OpenMetrics text); `GET /` a pointer to it;
//! anything else 404 or 405. Connections are served one task each; a client that
//! opens and idles is dropped after a minute.

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tracing::debug;

/// The content type of the exposition.
pub const CONTENT: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A running `/metrics` endpoint; stops when dropped.
pub struct Endpoint {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

/// Whether an endpoint may listen on `addr`: a loopback address always; any other only
/// when the operator said so (`expose`), because the endpoint has no authentication.
pub fn check_exposure(addr: SocketAddr, expose: bool) -> Result<(), String> {
    if addr.ip().is_loopback() || expose {
        Ok(())
    } else {
        Err(format!(
            "metrics address {addr} is reachable from other hosts and the endpoint has no \
             authentication: listen on 127.0.0.1 (or [::1]), or expose it on purpose \
             ([metrics] expose = true, SHINGLE_METRICS_EXPOSE=1, or --metrics-expose) and \
             restrict who can reach the port"
        ))
    }
}

impl Endpoint {
    /// Binds `addr` and serves until dropped. An address other hosts can reach needs
    /// `expose` ([`check_exposure`]).
    pub async fn bind(addr: SocketAddr, expose: bool) -> std::io::Result<Endpoint> {
        check_exposure(addr, expose).map_err(|e| std::io::Error::new(std::io::ErrorKind::PermissionDenied, e))?;
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            loop {
                let (stream, peer) = match listener.accept().await {
                    Ok(s) => s,
                    Err(e) => {
                        // Out of file descriptors and the like: wait, do not spin.
                        debug!(error = %e, "metrics endpoint: accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                tokio::spawn(async move {
                    let conn = http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(Duration::from_secs(60))
                        .keep_alive(true)
                        .serve_connection(TokioIo::new(stream), service_fn(answer));
                    if let Err(e) = conn.await {
                        debug!(%peer, error = %e, "metrics endpoint: connection ended");
                    }
                });
            }
        });
        Ok(Endpoint { addr, task })
    }

    /// The bound address (its port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    Ok(respond(req.method(), req.uri().path()))
}

fn respond(method: &Method, path: &str) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match (method, path) {
        (&Method::GET | &Method::HEAD, "/metrics") => (StatusCode::OK, CONTENT, crate::render()),
        (&Method::GET | &Method::HEAD, "/") => (
            StatusCode::OK,
            "text/plain; charset=utf-8",
            "Shingle metrics: GET /metrics\n".to_string(),
        ),
        (_, "/metrics" | "/") => (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            "only GET\n".to_string(),
        ),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "not found: try /metrics\n".to_string(),
        ),
    };
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Without `expose`, only loopback addresses: the wildcard and a host's own
    /// addresses are refused before anything is bound.
    #[tokio::test]
    async fn only_loopback_unless_exposed() {
        for a in ["127.0.0.1:9464", "127.8.9.10:1", "[::1]:9464"] {
            assert_eq!(check_exposure(a.parse().expect("addr"), false), Ok(()), "{a}");
        }
        for a in ["0.0.0.0:9464", "[::]:9464", "10.0.1.13:9464"] {
            let e = check_exposure(a.parse().expect("addr"), false).expect_err(a);
            assert!(e.contains("no authentication") && e.contains("expose"), "{e}");
            assert_eq!(check_exposure(a.parse().expect("addr"), true), Ok(()), "{a}");
        }
        let e = Endpoint::bind("0.0.0.0:0".parse().expect("addr"), false)
            .await
            .err()
            .expect("refused");
        assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied);
    }

    async fn get(addr: SocketAddr, request: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        s.write_all(request.as_bytes()).await.expect("write");
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.expect("read");
        String::from_utf8_lossy(&out).into_owned()
    }

    #[tokio::test]
    async fn serves_the_exposition_and_refuses_the_rest() {
        let e = Endpoint::bind("127.0.0.1:0".parse().expect("addr"), false)
            .await
            .expect("bind");
        let addr = e.local_addr();
        let ok = get(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await;
        assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
        assert!(
            ok.contains(CONTENT) && ok.contains("shingle_build_info") && ok.contains("# EOF"),
            "{ok}"
        );
        let missing = get(addr, "GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await;
        assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
        let post = get(
            addr,
            "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(post.starts_with("HTTP/1.1 405"), "{post}");
        let garbage = get(addr, "\x00\x01garbage\r\n\r\n").await;
        assert!(garbage.is_empty() || garbage.starts_with("HTTP/1.1 400"), "{garbage}");
        // The endpoint still serves after garbage.
        let again = get(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await;
        assert!(again.starts_with("HTTP/1.1 200"));
        drop(e);
    }
}
