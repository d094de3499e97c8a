//! The RPC and remote-read contracts that every transport implementation (TCP now,
//! RDMA behind the `rdma` feature) fulfils, and the typed-message layer on top.

use crate::error::TransportError;
use crate::frame::MsgKind;
use crate::region::RegionKey;
use bytes::{Bytes, BytesMut};
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

/// A typed request/response pair of a service. Messages are protobuf (prost) so that
/// fields can be added without breaking older peers.
pub trait Rpc: Send + Sync + 'static {
    /// Message kind on the wire; unique per service method.
    const KIND: MsgKind;
    /// Request message.
    type Request: prost::Message + Default + Send + 'static;
    /// Response message.
    type Response: prost::Message + Default + Send + 'static;
}

/// Per-call options.
#[derive(Clone, Copy, Debug, Default)]
pub struct CallOptions {
    /// Deadline for this call; the transport default when `None`.
    pub timeout: Option<Duration>,
}

impl CallOptions {
    /// Options with a deadline.
    pub fn timeout(t: Duration) -> Self {
        CallOptions { timeout: Some(t) }
    }
}

/// Request/response messaging with a peer.
pub trait RpcChannel: Send + Sync {
    /// Sends `payload` as a request of `kind` and waits for the reply payload.
    fn call_raw(
        &self,
        peer: SocketAddr,
        kind: MsgKind,
        payload: Bytes,
        opts: CallOptions,
    ) -> impl Future<Output = Result<Bytes, TransportError>> + Send;

    /// Typed call: encodes the request, decodes the response.
    fn call<R: Rpc>(
        &self,
        peer: SocketAddr,
        req: &R::Request,
        opts: CallOptions,
    ) -> impl Future<Output = Result<R::Response, TransportError>> + Send + use<'_, Self, R> {
        // The request is encoded here, so the future does not borrow it.
        let payload = Bytes::from(prost::Message::encode_to_vec(req));
        shingle_metrics::name_kind(R::KIND.0, shingle_metrics::short_type_name::<R>());
        async move {
            let reply = self.call_raw(peer, R::KIND, payload, opts).await?;
            <R::Response as prost::Message>::decode(reply).map_err(|e| TransportError::Decode {
                peer,
                message: e.to_string(),
            })
        }
    }
}

/// The result of a remote read: the outcome and the caller's buffer, returned in
/// every case so that a buffer is never written by the transport after the caller
/// has it back. (When a read times out, the transport keeps the original buffer until
/// the late reply has been drained and gives back a new, empty one.)
pub type ReadOutcome = (Result<(), TransportError>, BytesMut);

/// One-sided read of a registered region on a peer.
pub trait RemoteRead: Send + Sync {
    /// Reads `len` bytes at `offset` of the region `key` on `peer` into `buf` (cleared
    /// first; on success `buf.len() == len`), showing no capability: what the cluster's
    /// own nodes do.
    fn read(
        &self,
        peer: SocketAddr,
        key: RegionKey,
        offset: u64,
        len: u32,
        buf: BytesMut,
    ) -> impl Future<Output = ReadOutcome> + Send {
        self.read_capped(peer, key, Bytes::new(), offset, len, buf)
    }

    /// As [`RemoteRead::read`], showing `cap`, a read capability for the object the
    /// region holds bytes of ([`crate::RegionTable::register_for`]): what a caller with
    /// a client key needs (empty: none).
    fn read_capped(
        &self,
        peer: SocketAddr,
        key: RegionKey,
        cap: Bytes,
        offset: u64,
        len: u32,
        buf: BytesMut,
    ) -> impl Future<Output = ReadOutcome> + Send;

    /// Reads the bytes of `grant`, which `peer` answered (over RDMA) to a request of
    /// this client, with one RDMA READ on the connection that asked
    /// ([`crate::window`]). `Err(buf)`: not read that way (no RDMA here, or the
    /// connection was replaced, or the READ failed): the caller reads the bytes by
    /// their region key instead.
    fn read_grant(
        &self,
        peer: SocketAddr,
        grant: &crate::window::Grant,
        buf: BytesMut,
    ) -> impl Future<Output = Result<BytesMut, BytesMut>> + Send {
        let _ = (peer, grant);
        std::future::ready(Err(buf))
    }
}

/// Wire form of a TCP remote-read request.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RemoteReadRequest {
    /// Region slot.
    #[prost(uint32, tag = "1")]
    pub region: u32,
    /// Key generation.
    #[prost(uint32, tag = "2")]
    pub generation: u32,
    /// Region length named by the key.
    #[prost(uint64, tag = "3")]
    pub key_len: u64,
    /// Offset in the region.
    #[prost(uint64, tag = "4")]
    pub offset: u64,
    /// Bytes to read.
    #[prost(uint32, tag = "5")]
    pub len: u32,
    /// A read capability for the region's object, from a caller with a client key.
    #[prost(bytes = "bytes", tag = "6")]
    pub cap: Bytes,
}

impl RemoteReadRequest {
    /// The key named by the request.
    pub fn key(&self) -> RegionKey {
        RegionKey {
            region: self.region,
            generation: self.generation,
            len: self.key_len,
        }
    }
}

/// Declares a unit struct implementing [`Rpc`]: `rpc!(Name, 0x0200, Request, Response);`.
/// Used by every service so that message kinds and types are declared one way.
#[macro_export]
macro_rules! rpc {
    ($name:ident, $kind:expr, $req:ty, $resp:ty) => {
        #[doc = concat!("The `", stringify!($name), "` call.")]
        pub struct $name;
        impl $crate::Rpc for $name {
            const KIND: $crate::MsgKind = $crate::MsgKind($kind);
            type Request = $req;
            type Response = $resp;
        }
    };
}
