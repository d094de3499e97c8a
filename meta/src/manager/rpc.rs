//! Wire messages of the manager role. All kinds live in `0x0300..=0x03FF`.
//!
//! | kind     | name              | payload                                             |
//! |----------|-------------------|-----------------------------------------------------|
//! | `0x0300` | AppendEntries     | JSON of openraft's request / `Result<resp, error>`  |
//! | `0x0301` | Vote              | same                                                |
//! | `0x0302` | InstallSnapshot   | same (one chunk)                                    |
//! | `0x0310` | [`GetMap`]        | protobuf [`GetMapRequest`] / [`GetMapResponse`]     |
//! | `0x0311` | [`Propose`]       | protobuf [`ProposeRequest`] / [`ProposeResponse`]   |
//! | `0x0312` | [`Heartbeat`]     | protobuf [`HeartbeatRequest`] / [`HeartbeatResponse`] |
//! | `0x0313` | [`Report`]        | protobuf [`ReportRequest`] / [`ReportResponse`]     |
//!
//! The Raft messages are openraft's own types in JSON: they are only exchanged between
//! managers of one build, and their shape is openraft's to evolve. The client-facing
//! messages are protobuf like every other Shingle service, carrying the map and commands
//! as JSON text (the map's serde form is its only stable encoding).

/// Message kinds of the Raft RPCs between managers (raw JSON payloads).
pub mod kinds {
    use shingle_transport::MsgKind;

    /// openraft `AppendEntries` (replication and heartbeats).
    pub const APPEND_ENTRIES: MsgKind = MsgKind(0x0300);
    /// openraft `Vote` (elections).
    pub const VOTE: MsgKind = MsgKind(0x0301);
    /// openraft `InstallSnapshot` (one chunk of a snapshot).
    pub const INSTALL_SNAPSHOT: MsgKind = MsgKind(0x0302);
}

/// Application codes of the manager's error replies (`Code::Application`).
pub mod app_code {
    /// A forwarded proposal reached a manager that is not the leader (any more).
    pub const NOT_LEADER: u32 = 1;
    /// No leader could be reached before the proposal deadline.
    pub const NO_LEADER: u32 = 2;
    /// The proposal was sent to the leader but not seen committed in time; it may still be.
    pub const UNCERTAIN: u32 = 3;
}

/// Asks a manager for its copy of the cluster map.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GetMapRequest {
    /// The epoch the caller already holds; absent to always receive the map.
    #[prost(uint64, optional, tag = "1")]
    pub known_epoch: Option<u64>,
    /// Also send the maps of epochs `history_from..epoch` (the ones between the
    /// caller's and the newest), when the manager holds every one of them and there are
    /// at most [`MAX_HISTORY`].
    #[prost(uint64, optional, tag = "2")]
    pub history_from: Option<u64>,
}

/// Most maps of history one [`GetMapResponse`] carries.
pub const MAX_HISTORY: u64 = 16;

/// A manager's copy of the cluster map (the one it has applied; a follower's may trail
/// the leader's by a heartbeat).
#[derive(Clone, PartialEq, prost::Message)]
pub struct GetMapResponse {
    /// The manager's epoch.
    #[prost(uint64, tag = "1")]
    pub epoch: u64,
    /// False when the caller's `known_epoch` is at least `epoch`; `map_json` is then empty.
    #[prost(bool, tag = "2")]
    pub newer: bool,
    /// serde_json of the [`crate::map::ClusterMap`].
    #[prost(string, tag = "3")]
    pub map_json: String,
    /// serde_json of the maps of epochs `history_from..epoch`, in order: all of them
    /// or none.
    #[prost(string, repeated, tag = "4")]
    pub history_json: Vec<String>,
}

/// Proposes a [`crate::map::MapCommand`].
#[derive(Clone, PartialEq, prost::Message)]
pub struct ProposeRequest {
    /// serde_json of the command.
    #[prost(string, tag = "1")]
    pub command_json: String,
    /// Set by a manager forwarding to the leader: the receiver must not forward again,
    /// and answers `NOT_LEADER` when it is not the leader.
    #[prost(bool, tag = "2")]
    pub forwarded: bool,
}

/// The outcome of a committed proposal.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ProposeResponse {
    /// The map's epoch after the command (when it was applied).
    #[prost(uint64, tag = "1")]
    pub epoch: u64,
    /// serde_json of a [`super::MapRefusal`] when the map refused the command, else empty.
    #[prost(string, tag = "2")]
    pub refusal_json: String,
}

/// A node tells the managers it is alive (sent to every manager; the leader acts on it).
#[derive(Clone, PartialEq, prost::Message)]
pub struct HeartbeatRequest {
    /// The node.
    #[prost(uint64, tag = "1")]
    pub node_id: u64,
    /// The epoch of the node's map.
    #[prost(uint64, tag = "2")]
    pub epoch: u64,
}

/// The manager's epoch, so the node knows when to fetch the map.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HeartbeatResponse {
    /// The manager's map epoch.
    #[prost(uint64, tag = "1")]
    pub epoch: u64,
    /// The Raft leader this manager knows of (0: none).
    #[prost(uint64, tag = "2")]
    pub leader: u64,
    /// This manager's Raft term.
    #[prost(uint64, tag = "3")]
    pub term: u64,
}

/// A node or client tells the managers it could not reach some nodes (a connect
/// failed, a connection broke). A hint only: the leader probes each itself and marks
/// Down at once only a node whose address refuses connections (no process listens).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ReportRequest {
    /// Node ids the sender could not reach.
    #[prost(uint64, repeated, tag = "1")]
    pub unreachable: Vec<u64>,
}

/// Nothing: the report is acted on (or not) in the background.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ReportResponse {}

use shingle_transport::rpc;
rpc!(GetMap, 0x0310, GetMapRequest, GetMapResponse);
rpc!(Report, 0x0313, ReportRequest, ReportResponse);
rpc!(Propose, 0x0311, ProposeRequest, ProposeResponse);
rpc!(Heartbeat, 0x0312, HeartbeatRequest, HeartbeatResponse);
