//! # shingle-transport
//!
//! Everything that crosses a wire between Shingle processes, and nothing about files.
//!
//! - [`frame`]: the versioned, checksummed, bounded frame format and its pure decoder.
//! - [`auth`]: the mutual HMAC challenge-response every connection starts with.
//! - [`cap`]: signed, expiring capabilities one server hands out and others check.
//! - [`clock`]: the one wall clock.
//! - [`peer::PeerClient`] / [`server::Server`]: multiplexed, pipelined RPC over TCP
//!   with per-request deadlines, a connection pool per peer, reconnect backoff,
//!   bounded in-flight requests and bytes, and graceful shutdown.
//! - [`region`] and [`rpc::RemoteRead`]: the remote-read verb. A server registers
//!   memory or mmap'd files and hands out keys; a client reads (key, offset, len) into
//!   a buffer it owns. Over TCP the server checks every read as an RDMA NIC would.
//! - [`window`]: read windows — the bytes a server grants a client's RDMA connection,
//!   read with one READ (the allocator is a pure core); `rdma` (feature `rdma`) holds
//!   the queue pairs, protection domains and registrations around them.
//! - [`health`]: phi-accrual failure detection and hedge delays per peer.
//! - [`hedge`]: hedged requests over a list of candidates (one answer from any replica,
//!   k answers from any k shards), tested in virtual time.
//! - [`conformance`]: the suite every transport implementation must pass.
//!
//! Layering rule: this crate knows frames, peers and regions. It must never learn about
//! inodes, chunks or placement; services define their messages on top of [`rpc::Rpc`].

pub mod auth;
pub mod backoff;
pub mod cap;
pub mod clock;
pub mod config;
pub mod conformance;
pub mod error;
pub mod fragment;
pub mod frame;
pub mod health;
pub mod hedge;
pub mod peer;
#[cfg(feature = "rdma")]
pub mod rdma;
pub mod region;
pub mod rpc;
pub mod server;
pub mod status;
mod trace;
pub mod window;
mod wire;

pub use auth::ClusterSecret;
pub use config::TransportConfig;
pub use error::TransportError;
pub use frame::MsgKind;
pub use health::Health;
pub use peer::PeerClient;
pub use region::{AccessError, RegionKey, RegionTable};
pub use rpc::{CallOptions, RemoteRead, Rpc, RpcChannel};
pub use server::{CallContext, Router, Server};
pub use status::{Code, Status};
pub use window::{Grant, Window};

/// Names message kind `kind` after type `R` in metrics labels (`Lookup` rather than
/// `0x0400`). Typed RPCs ([`Rpc`]) are named when registered or called; services with
/// message traits of their own call this.
pub fn name_kind<R: ?Sized>(kind: MsgKind) {
    shingle_metrics::name_kind(kind.0, shingle_metrics::short_type_name::<R>());
}

/// Names message kind `kind` `name` in metrics labels.
pub fn name_kind_as(kind: MsgKind, name: &'static str) {
    shingle_metrics::name_kind(kind.0, name);
}
