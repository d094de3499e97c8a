//! Transport limits and timeouts. Every queue and buffer of the transport is bounded
//! by one of these numbers.

use std::time::Duration;

/// Limits and timeouts of one endpoint (client pool or server).
#[derive(Clone, Debug, PartialEq)]
pub struct TransportConfig {
    /// Largest payload accepted or sent in one frame.
    pub max_frame_bytes: u32,
    /// Requests in flight per connection; callers beyond it wait (back-pressure).
    pub max_inflight_requests: u32,
    /// Request plus response bytes in flight per connection (a client counts what it
    /// expects back; a server holds a request's bytes until its reply is written).
    pub max_inflight_bytes: u64,
    /// Request plus response bytes in flight over all of a server's connections: what
    /// peers can make it hold at once (a connection beyond it stops being read).
    pub max_server_bytes: u64,
    /// Time allowed to establish a TCP connection.
    pub connect_timeout: Duration,
    /// Time allowed for the authentication handshake.
    pub handshake_timeout: Duration,
    /// Default per-request deadline when the caller gives none.
    pub request_timeout: Duration,
    /// Connections kept to each peer; calls are spread over them.
    pub conns_per_peer: usize,
    /// First delay before reconnecting to a peer whose connect failed.
    pub backoff_initial: Duration,
    /// Longest delay between reconnect attempts.
    pub backoff_max: Duration,
    /// Time a shutting-down server gives in-flight requests to finish.
    pub shutdown_grace: Duration,
}

impl Default for TransportConfig {
    fn default() -> Self {
        TransportConfig {
            max_frame_bytes: 64 << 20,
            max_inflight_requests: 512,
            max_inflight_bytes: 256 << 20,
            max_server_bytes: 1 << 30,
            connect_timeout: Duration::from_secs(3),
            handshake_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(30),
            conns_per_peer: 2,
            backoff_initial: Duration::from_millis(50),
            backoff_max: Duration::from_secs(5),
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

impl TransportConfig {
    /// Checks that the numbers make sense together.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_frame_bytes == 0 || self.max_frame_bytes > crate::frame::PAYLOAD_LEN_CEILING {
            return Err(format!(
                "max_frame_bytes must be in 1..=1 GiB, got {}",
                self.max_frame_bytes
            ));
        }
        if self.max_inflight_requests == 0 {
            return Err("max_inflight_requests must be at least 1".into());
        }
        if self.max_inflight_bytes < u64::from(self.max_frame_bytes) {
            return Err("max_inflight_bytes must be at least max_frame_bytes".into());
        }
        if self.max_server_bytes < self.max_inflight_bytes {
            return Err("max_server_bytes must be at least max_inflight_bytes".into());
        }
        if self.conns_per_peer == 0 || self.conns_per_peer > 64 {
            return Err("conns_per_peer must be in 1..=64".into());
        }
        if self.backoff_initial.is_zero() || self.backoff_max < self.backoff_initial {
            return Err("backoff_initial must be > 0 and <= backoff_max".into());
        }
        Ok(())
    }
}
