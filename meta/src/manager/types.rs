//! The openraft type configuration of the manager group and the values it replicates.

use crate::ids::{Epoch, NodeId};
use crate::map::{MapCommand, MapError};
use serde::{Deserialize, Serialize};
use std::io::Cursor;
use std::net::{Ipv4Addr, SocketAddr};

openraft::declare_raft_types!(
    /// The manager group's Raft types: members are named by `u64`, carry their RPC address,
    /// and replicate [`MapCommand`]s whose outcome is a [`MapResponse`].
    pub TypeConfig:
        D = MapCommand,
        R = MapResponse,
        NodeId = u64,
        Node = ManagerNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
        Responder = openraft::impls::OneshotResponder<TypeConfig>,
);

/// What the Raft membership records about a manager: where its transport server listens.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManagerNode {
    /// The manager's RPC address (the node's transport server).
    pub addr: SocketAddr,
}

impl Default for ManagerNode {
    /// An unspecified address; openraft needs a default, the manager never stores one.
    fn default() -> Self {
        ManagerNode {
            addr: SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
        }
    }
}

/// The outcome of one replicated log entry, as the leader reports it to the proposer.
///
/// Every member computes the same value, because [`crate::map::ClusterMap::apply`] is
/// deterministic; a refused command is still committed (and changes nothing).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MapResponse {
    /// The command was applied; the map is at this epoch (unchanged when the command changed
    /// nothing). Membership and leader-blank entries also answer with the current epoch.
    Applied(Epoch),
    /// The map refused the command.
    Refused(MapRefusal),
}

impl MapResponse {
    /// The outcome as [`ClusterMap::apply`](crate::map::ClusterMap::apply) returned it.
    pub fn into_result(self) -> Result<Epoch, MapError> {
        match self {
            MapResponse::Applied(e) => Ok(e),
            MapResponse::Refused(r) => Err(r.into()),
        }
    }
}

impl From<Result<Epoch, MapError>> for MapResponse {
    fn from(r: Result<Epoch, MapError>) -> Self {
        match r {
            Ok(e) => MapResponse::Applied(e),
            Err(e) => MapResponse::Refused(MapRefusal::from(&e)),
        }
    }
}

/// A serialisable mirror of [`MapError`], so that a refusal crosses the wire (and a
/// forwarding hop) with its type intact.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MapRefusal {
    /// See [`MapError::UnknownNode`].
    UnknownNode(NodeId),
    /// See [`MapError::NotOut`].
    NotOut(NodeId),
    /// See [`MapError::AddressInUse`].
    AddressInUse {
        /// The address.
        addr: SocketAddr,
        /// Its owner.
        other: NodeId,
    },
    /// See [`MapError::BadClientName`].
    BadClientName(String),
    /// See [`MapError::UnknownClient`].
    UnknownClient(String),
}

impl From<&MapError> for MapRefusal {
    fn from(e: &MapError) -> Self {
        match e {
            MapError::UnknownNode(id) => MapRefusal::UnknownNode(*id),
            MapError::NotOut(id) => MapRefusal::NotOut(*id),
            MapError::AddressInUse { addr, other } => MapRefusal::AddressInUse {
                addr: *addr,
                other: *other,
            },
            MapError::BadClientName(n) => MapRefusal::BadClientName(n.clone()),
            MapError::UnknownClient(n) => MapRefusal::UnknownClient(n.clone()),
        }
    }
}

impl From<MapRefusal> for MapError {
    fn from(r: MapRefusal) -> Self {
        match r {
            MapRefusal::UnknownNode(id) => MapError::UnknownNode(id),
            MapRefusal::NotOut(id) => MapError::NotOut(id),
            MapRefusal::AddressInUse { addr, other } => MapError::AddressInUse { addr, other },
            MapRefusal::BadClientName(n) => MapError::BadClientName(n),
            MapRefusal::UnknownClient(n) => MapError::UnknownClient(n),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_round_trip_through_json() {
        let errors = [
            MapError::UnknownNode(NodeId(3)),
            MapError::NotOut(NodeId(4)),
            MapError::AddressInUse {
                addr: SocketAddr::from(([127, 0, 0, 1], 9)),
                other: NodeId(5),
            },
            MapError::BadClientName("a b".into()),
            MapError::UnknownClient("gone".into()),
        ];
        for e in errors {
            let r = MapResponse::from(Err(e.clone()));
            let json = serde_json::to_string(&r).expect("serialise");
            let back: MapResponse = serde_json::from_str(&json).expect("parse");
            assert_eq!(back.into_result(), Err(e));
        }
        let ok = MapResponse::from(Ok(Epoch(7)));
        assert_eq!(ok.into_result(), Ok(Epoch(7)));
    }
}
