//! The transport's one error type.

use crate::auth::AuthError;
use crate::frame::FrameError;
use crate::region::AccessError;
use crate::status::Status;
use std::net::SocketAddr;
use std::time::Duration;

/// Everything a call or a remote read can fail with.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// TCP connect failed or timed out.
    #[error("cannot connect to {peer}: {source}")]
    Connect {
        /// The peer.
        peer: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The handshake failed (wrong secret, not a Shingle peer, timeout).
    #[error("cannot authenticate with {peer}: {source}")]
    Auth {
        /// The peer.
        peer: SocketAddr,
        /// Why.
        source: AuthError,
    },
    /// Recent connects to the peer failed; no new attempt until the backoff ends.
    #[error("peer {peer} unavailable for another {retry_in:?} after: {last_error}")]
    PeerUnavailable {
        /// The peer.
        peer: SocketAddr,
        /// Time until the next connect attempt.
        retry_in: Duration,
        /// The error of the last attempt.
        last_error: String,
    },
    /// The connection closed before the reply arrived.
    #[error("connection to {peer} closed: {reason}")]
    ConnectionClosed {
        /// The peer.
        peer: SocketAddr,
        /// What closed it.
        reason: String,
    },
    /// No reply within the deadline.
    #[error("request {kind} to {peer} timed out after {after:?}")]
    Timeout {
        /// The peer.
        peer: SocketAddr,
        /// The message kind.
        kind: crate::frame::MsgKind,
        /// The deadline.
        after: Duration,
    },
    /// The peer sent bytes that are not a valid frame; the connection was closed.
    #[error("malformed frame from {peer}: {source}")]
    Frame {
        /// The peer.
        peer: SocketAddr,
        /// What was wrong.
        source: FrameError,
    },
    /// The request is larger than the frame limit.
    #[error("request of {len} bytes exceeds the frame limit of {max} bytes")]
    TooLarge {
        /// Payload bytes.
        len: usize,
        /// Limit.
        max: u32,
    },
    /// The server answered with an error.
    #[error("{peer} answered: {status}")]
    Remote {
        /// The peer.
        peer: SocketAddr,
        /// The error reply.
        status: Status,
    },
    /// A remote read was refused by the region checks.
    #[error("remote read refused: {0}")]
    Access(#[from] AccessError),
    /// The reply could not be decoded.
    #[error("undecodable reply from {peer}: {message}")]
    Decode {
        /// The peer.
        peer: SocketAddr,
        /// Decoder message.
        message: String,
    },
    /// The client was closed.
    #[error("transport is shut down")]
    Shutdown,
}

impl TransportError {
    /// True when another replica may succeed where this peer failed (connection-level
    /// failures and timeouts), as opposed to an answer from the peer.
    pub fn is_peer_failure(&self) -> bool {
        matches!(
            self,
            TransportError::Connect { .. }
                | TransportError::PeerUnavailable { .. }
                | TransportError::ConnectionClosed { .. }
                | TransportError::Timeout { .. }
                | TransportError::Frame { .. }
        )
    }

    /// The error reply, when the server sent one.
    pub fn status(&self) -> Option<&Status> {
        match self {
            TransportError::Remote { status, .. } => Some(status),
            _ => None,
        }
    }
}
