//! Raft messages between managers, over Shingle's transport.
//!
//! Each openraft RPC is one transport request of its own kind, `0x0300..=0x0302`, whose
//! payload is the serde_json encoding of openraft's request type; the reply payload is the
//! JSON of `Result<Response, RaftError>`, so a refusal by the remote Raft comes back as
//! [`RemoteError`]. Transport failures map onto openraft's retry classes:
//!
//! - connect failures, closed connections, timeouts, a peer in reconnect backoff and a peer
//!   whose manager is not running (yet, or any more) are [`Unreachable`]: openraft backs
//!   off before retrying, and a dead peer simply fails to vote;
//! - anything else (an undecodable reply, an error status) is a [`NetworkError`].

use super::rpc::kinds;
use super::types::{ManagerNode, TypeConfig};
use bytes::Bytes;
use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{Backoff, RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use shingle_transport::{CallOptions, Code, MsgKind, PeerClient, RpcChannel, TransportError};
use std::net::SocketAddr;
use std::time::Duration;

/// Creates one [`RaftPeer`] per replication target; all share the node's [`PeerClient`]
/// (and so its authenticated, pooled connections).
pub(crate) struct Network {
    client: PeerClient,
    backoff: Duration,
}

impl Network {
    /// A factory on `client`; `backoff` is the pause after a peer turned out unreachable.
    pub fn new(client: PeerClient, backoff: Duration) -> Self {
        Network { client, backoff }
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = RaftPeer;

    async fn new_client(&mut self, target: u64, node: &ManagerNode) -> RaftPeer {
        RaftPeer {
            client: self.client.clone(),
            target,
            addr: node.addr,
            backoff: self.backoff,
        }
    }
}

/// Sends Raft RPCs to one peer manager.
pub(crate) struct RaftPeer {
    client: PeerClient,
    target: u64,
    addr: SocketAddr,
    backoff: Duration,
}

/// True when the error means "the peer is not there" rather than "the peer said something".
pub(crate) fn unreachable(e: &TransportError) -> bool {
    e.is_peer_failure()
        || matches!(e, TransportError::Shutdown)
        || e.status().is_some_and(|s| s.code == Code::ShuttingDown)
}

impl RaftPeer {
    async fn call<Req, Resp, E>(
        &self,
        kind: MsgKind,
        req: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<u64, ManagerNode, RaftError<u64, E>>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let payload = serde_json::to_vec(req).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let reply = self
            .client
            .call_raw(
                self.addr,
                kind,
                Bytes::from(payload),
                CallOptions::timeout(option.hard_ttl()),
            )
            .await
            .map_err(|e| {
                tracing::debug!(target = self.target, addr = %self.addr, %kind, error = %e, "raft rpc failed");
                if unreachable(&e) {
                    RPCError::Unreachable(Unreachable::new(&e))
                } else {
                    RPCError::Network(NetworkError::new(&e))
                }
            })?;
        let res: Result<Resp, RaftError<u64, E>> =
            serde_json::from_slice(&reply).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        res.map_err(|e| {
            RPCError::RemoteError(RemoteError::new_with_node(
                self.target,
                ManagerNode { addr: self.addr },
                e,
            ))
        })
    }
}

impl RaftNetwork<TypeConfig> for RaftPeer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RPCError<u64, ManagerNode, RaftError<u64>>> {
        self.call(kinds::APPEND_ENTRIES, &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<u64>, RPCError<u64, ManagerNode, RaftError<u64, InstallSnapshotError>>> {
        self.call(kinds::INSTALL_SNAPSHOT, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> Result<VoteResponse<u64>, RPCError<u64, ManagerNode, RaftError<u64>>> {
        self.call(kinds::VOTE, &rpc, &option).await
    }

    fn backoff(&self) -> Backoff {
        Backoff::new(std::iter::repeat(self.backoff))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shingle_transport::Status;

    #[test]
    fn transport_failures_are_unreachable_and_answers_are_not() {
        let peer = SocketAddr::from(([127, 0, 0, 1], 1));
        let refused = TransportError::Connect {
            peer,
            source: std::io::ErrorKind::ConnectionRefused.into(),
        };
        assert!(unreachable(&refused));
        let stopped = TransportError::Remote {
            peer,
            status: Status::new(Code::ShuttingDown, "manager not running"),
        };
        assert!(unreachable(&stopped));
        let bad = TransportError::Remote {
            peer,
            status: Status::new(Code::InvalidRequest, "cannot decode"),
        };
        assert!(!unreachable(&bad));
    }
}
