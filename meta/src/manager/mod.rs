//! The manager role: the cluster map, replicated by Raft.
//!
//! A manager is one member of a small Raft group (1 in a dev cluster, 3 or 5 in
//! production) built on [`openraft`] 0.9. The replicated log carries
//! [`MapCommand`]s; the state machine is the [`ClusterMap`], whose
//! [`apply`](ClusterMap::apply) is deterministic, so every member computes the same map and
//! the same answer to every command. Decision record: `docs/decisions/0006-manager-raft.md`.
//!
//! What it owns:
//! - durable Raft state in one redb database in [`ManagerConfig::dir`] (log, vote, commit
//!   point, applied map, last snapshot), fsync'd before anything is acknowledged (the
//!   byte layout is documented in `store.rs`);
//! - the Raft RPCs between managers and the client-facing `GetMap` / `Propose` RPCs, all on
//!   Shingle's authenticated transport ([`rpc`] lists the kinds, `0x0300..=0x03FF`);
//! - forwarding: [`Manager::propose`] works on any member; a follower hands the command to
//!   the leader with a `Propose` RPC;
//! - liveness, on the leader: nodes heartbeat every manager; phi-accrual over the
//!   silence (at the latest `down_after_ms`) marks a node Down, `out_after_ms` Down marks
//!   it Out, a heartbeat or registration brings it back Up. A node reported unreachable
//!   (`Report`) is probed with a TCP connect and marked Down at once when the
//!   connection is refused (decision 0009); a newly elected leader probes every Up
//!   node so (the old leader may have died, and nodes with it);
//! - the recent maps, epoch by epoch ([`crate::map::MapHistory`], in memory): `GetMap`
//!   hands out those between the caller's epoch and the newest, so meta nodes adopt
//!   every epoch in turn (decision 0008).
//!
//! What it must never do: write consensus logic of its own (openraft decides who leads and
//! what is committed), serve a map it has not applied, or change the map other than by a
//! committed command.
//!
//! ## Wiring
//! The manager does not bind a socket. Its handlers come as a [`Router`] that the caller
//! merges into the node's transport [`Server`](shingle_transport::Server). Because a test
//! (or a node on port 0) only learns its address once the server is bound, the router
//! dispatches through a [`ManagerSlot`]: make the slot, bind the server with
//! [`ManagerSlot::router`], then [`Manager::start_in`] the slot with the bound address.
//! Requests that arrive while the slot is empty (before start, after shutdown) are answered
//! `ShuttingDown`, which peers treat as "unreachable". When the address is fixed by
//! configuration, [`Manager::start`] followed by [`Manager::router`] is simpler.
//!
//! ```no_run
//! # async fn demo(client: shingle_transport::PeerClient, secret: shingle_transport::ClusterSecret,
//! #               map: shingle_meta::map::ClusterMap) -> Result<(), Box<dyn std::error::Error>> {
//! use shingle_meta::manager::{Manager, ManagerConfig, ManagerSlot};
//! use shingle_transport::{RegionTable, Server, TransportConfig};
//! let slot = ManagerSlot::new();
//! let server = Server::bind("127.0.0.1:0".parse()?, TransportConfig::default(), secret,
//!                           slot.router(), std::sync::Arc::new(RegionTable::new())).await?;
//! let config = ManagerConfig::new(1, server.local_addr(), "/var/lib/shingle/manager".into());
//! let manager = Manager::start_in(&slot, config, client, map).await?;
//! manager.initialize([(1, server.local_addr())].into()).await?;
//! # Ok(()) }
//! ```
//!
//! ## Retries and duplicates
//! A proposal whose leader fails mid-way is retried (on the new leader) until
//! [`ManagerConfig::propose_timeout_ms`]; it may then be applied twice. Every
//! [`MapCommand`] is idempotent in effect: a repeated `Register` or `SetState` changes
//! nothing, and a repeated `Remove` is refused with `UnknownNode`.

mod calls;
mod network;
pub mod rpc;
mod store;
mod types;

pub use calls::{fetch_map, fetch_map_since, propose};
pub use types::{ManagerNode, MapRefusal, MapResponse, TypeConfig};

use crate::ids::{Epoch, NodeId};
use crate::map::{ClusterMap, MapCommand, MapError};
use bytes::Bytes;
use network::Network;
use openraft::error::{ClientWriteError, Fatal, InitializeError, RaftError};
use openraft::raft::InstallSnapshotRequest;
use openraft::{Config, Raft, ServerState, SnapshotPolicy};
use parking_lot::{Mutex, RwLock};
use rpc::{GetMapRequest, GetMapResponse, ProposeRequest, ProposeResponse, app_code, kinds};
use serde::Serialize;
use serde::de::DeserializeOwned;
use shingle_transport::{CallContext, CallOptions, Code, PeerClient, Router, RpcChannel, Status, TransportError};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use store::{LogStore, SmState, StateMachine};
use tokio::sync::watch;
use tracing::{debug, info, warn};

/// Settings of one manager.
#[derive(Clone, Debug, PartialEq)]
pub struct ManagerConfig {
    /// This member's Raft id; stable for the life of `dir`.
    pub node_id: u64,
    /// The address of this node's transport server, as the other managers reach it. The
    /// group's membership records it, so it must stay the same across restarts.
    pub addr: SocketAddr,
    /// Directory of the manager's database (created if missing).
    pub dir: PathBuf,
    /// Leader heartbeat interval.
    pub heartbeat_ms: u64,
    /// Shortest election timeout; must exceed the heartbeat.
    pub election_timeout_min_ms: u64,
    /// Longest election timeout; must exceed the shortest.
    pub election_timeout_max_ms: u64,
    /// Applied entries between snapshots; as many more are kept in the log after one, for
    /// followers that lag a little.
    pub snapshot_every_logs: u64,
    /// How long [`Manager::propose`] keeps looking for a leader before giving up.
    pub propose_timeout_ms: u64,
    /// A node whose heartbeats stop for this long is marked Down by the leader, at the
    /// latest (phi-accrual may decide earlier, see `down_phi`).
    pub down_after_ms: u64,
    /// Suspicion level φ of a node's heartbeat silence at which it is marked Down
    /// (phi-accrual over its heartbeat intervals, with `heartbeat_pause_ms` tolerated).
    pub down_phi: f64,
    /// Silence tolerated on top of a node's usual heartbeat interval before φ rises
    /// (GC pauses, a busy host).
    pub heartbeat_pause_ms: u64,
    /// A node Down this long is marked Out: it leaves placement, its shards are rebuilt
    /// and its partitions re-replicated elsewhere. 0 never marks a node Out.
    pub out_after_ms: u64,
    /// When a node or client reports a node unreachable, the leader connects to it, and
    /// a refused connection (nothing listens: the process is gone) marks it Down at
    /// once instead of after `down_after_ms` of silence.
    pub down_on_refused: bool,
}

impl ManagerConfig {
    /// A configuration with production defaults: heartbeat 40 ms, elections after
    /// 120–240 ms of silence, a snapshot every 1000 entries, proposals given 10 s.
    ///
    /// Raft (openraft 0.9) holds an election only once the last leader's lease (the
    /// longest election timeout) has also run out, so a dead leader is replaced 360–480
    /// ms after its last heartbeat; every metadata mutation on a partition the dead
    /// leader's node was a member of waits that long for the map that marks it Down
    /// (with 400–800 ms it was 1.2–1.6 s). A manager silent that long (a stalled host)
    /// costs an election, nothing more.
    pub fn new(node_id: u64, addr: SocketAddr, dir: PathBuf) -> Self {
        ManagerConfig {
            node_id,
            addr,
            dir,
            heartbeat_ms: 40,
            election_timeout_min_ms: 120,
            election_timeout_max_ms: 240,
            snapshot_every_logs: 1000,
            propose_timeout_ms: 10_000,
            down_after_ms: 4_000,
            down_phi: 8.0,
            heartbeat_pause_ms: 1_000,
            out_after_ms: 600_000,
            down_on_refused: true,
        }
    }

    /// Checks that the numbers make sense together.
    pub fn validate(&self) -> Result<(), ManagerError> {
        let bad = |m: String| Err(ManagerError::Config(m));
        if self.heartbeat_ms == 0 {
            return bad("heartbeat_ms must be at least 1".into());
        }
        if self.election_timeout_min_ms <= self.heartbeat_ms {
            return bad(format!(
                "election_timeout_min_ms ({}) must exceed heartbeat_ms ({})",
                self.election_timeout_min_ms, self.heartbeat_ms
            ));
        }
        if self.election_timeout_max_ms <= self.election_timeout_min_ms {
            return bad(format!(
                "election_timeout_max_ms ({}) must exceed election_timeout_min_ms ({})",
                self.election_timeout_max_ms, self.election_timeout_min_ms
            ));
        }
        if self.snapshot_every_logs == 0 {
            return bad("snapshot_every_logs must be at least 1".into());
        }
        if self.propose_timeout_ms == 0 {
            return bad("propose_timeout_ms must be at least 1".into());
        }
        Ok(())
    }

    fn raft_config(&self, cluster_id: &str) -> Result<Config, ManagerError> {
        let c = Config {
            cluster_name: format!("shingle-{cluster_id}"),
            heartbeat_interval: self.heartbeat_ms,
            election_timeout_min: self.election_timeout_min_ms,
            election_timeout_max: self.election_timeout_max_ms,
            // One chunk carries a whole map; give it time even on a busy node.
            install_snapshot_timeout: (self.election_timeout_max_ms * 4).max(1000),
            snapshot_policy: SnapshotPolicy::LogsSinceLast(self.snapshot_every_logs),
            max_in_snapshot_log_to_keep: self.snapshot_every_logs,
            ..Config::default()
        };
        c.validate().map_err(|e| ManagerError::Config(e.to_string()))
    }
}

/// Everything the manager can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    /// The configuration is inconsistent.
    #[error("invalid manager configuration: {0}")]
    Config(String),
    /// The manager's database could not be opened, read or written.
    #[error("manager storage: {0}")]
    Storage(String),
    /// The directory holds the map of another cluster.
    #[error("manager directory holds cluster {found:?}, this node belongs to {expected:?}")]
    WrongCluster {
        /// Cluster id found on disk.
        found: String,
        /// Cluster id of the initial map.
        expected: String,
    },
    /// [`Manager::start_in`] was given a slot that already serves a running manager.
    #[error("the manager slot already serves a running manager")]
    SlotTaken,
    /// openraft failed (a storage error stops the Raft node for good).
    #[error("raft: {0}")]
    Raft(String),
    /// The manager has been shut down.
    #[error("the manager is shut down")]
    Stopped,
    /// The map refused the command (it was committed and changed nothing).
    #[error("command refused: {0}")]
    Refused(#[from] MapError),
    /// A forwarded proposal reached a manager that is not the leader.
    #[error("not the manager leader (leader: {leader:?})")]
    NotLeader {
        /// The leader this manager knows of.
        leader: Option<u64>,
    },
    /// No leader took the proposal before the deadline.
    #[error("no manager leader took the proposal within {waited:?}: {last}")]
    NoLeader {
        /// Time spent trying.
        waited: Duration,
        /// Why the last attempt failed.
        last: String,
    },
    /// The leader took the proposal but it was not seen committed in time; it may still be.
    #[error("proposal not committed within {0:?}; it may still be")]
    Uncertain(Duration),
    /// A wait ended before its condition held.
    #[error("timed out after {waited:?} waiting for {what}")]
    Timeout {
        /// Time waited.
        waited: Duration,
        /// The condition.
        what: &'static str,
    },
    /// A transport call failed or was answered with an error.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// A reply could not be decoded.
    #[error("undecodable reply from {peer}: {message}")]
    Decode {
        /// The peer.
        peer: SocketAddr,
        /// Decoder message.
        message: String,
    },
    /// A client helper was given no manager addresses.
    #[error("no manager addresses given")]
    NoManagers,
    /// Every manager was tried and none answered.
    #[error("none of {tried} managers answered; last error: {last}")]
    Unavailable {
        /// Managers tried.
        tried: usize,
        /// The last failure.
        last: Box<ManagerError>,
    },
}

impl From<store::DbError> for ManagerError {
    fn from(e: store::DbError) -> Self {
        ManagerError::Storage(e.to_string())
    }
}

impl ManagerError {
    /// The error reply a handler sends for this error.
    fn to_status(&self) -> Status {
        match self {
            ManagerError::NotLeader { .. } => Status::application(app_code::NOT_LEADER, self.to_string()),
            ManagerError::NoLeader { .. } => Status::application(app_code::NO_LEADER, self.to_string()),
            ManagerError::Uncertain(_) => Status::application(app_code::UNCERTAIN, self.to_string()),
            ManagerError::Stopped => Status::new(Code::ShuttingDown, self.to_string()),
            _ => Status::new(Code::Internal, self.to_string()),
        }
    }
}

/// The Raft role of a manager.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Not (yet) a voting member: uninitialised, or catching up.
    Learner,
    /// A voter following a leader.
    Follower,
    /// A voter asking for votes.
    Candidate,
    /// The leader: it alone commits proposals.
    Leader,
    /// Stopped.
    Shutdown,
}

impl From<ServerState> for Role {
    fn from(s: ServerState) -> Self {
        match s {
            ServerState::Learner => Role::Learner,
            ServerState::Follower => Role::Follower,
            ServerState::Candidate => Role::Candidate,
            ServerState::Leader => Role::Leader,
            ServerState::Shutdown => Role::Shutdown,
        }
    }
}

/// A manager's state for monitoring (Prometheus export).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManagerMetrics {
    /// This member's id.
    pub id: u64,
    /// Its role.
    pub role: Role,
    /// The current Raft term.
    pub term: u64,
    /// The leader it knows of.
    pub leader: Option<u64>,
    /// Index of the last log entry it holds.
    pub last_log_index: Option<u64>,
    /// Index of the last entry applied to its map.
    pub last_applied_index: Option<u64>,
    /// Index up to which its last snapshot reaches.
    pub snapshot_index: Option<u64>,
    /// The epoch of its map.
    pub epoch: Epoch,
    /// The voting members.
    pub voters: Vec<u64>,
}

/// Where a node's transport server finds its manager: the [`Router`] made from a slot
/// dispatches to whatever manager is attached to it at the time of the request.
#[derive(Clone, Default)]
pub struct ManagerSlot {
    inner: Arc<RwLock<Option<Arc<Inner>>>>,
}

impl ManagerSlot {
    /// An empty slot; its router answers `ShuttingDown` until a manager is started in it.
    pub fn new() -> Self {
        Self::default()
    }

    fn get(&self) -> Result<Arc<Inner>, Status> {
        self.inner
            .read()
            .clone()
            .ok_or_else(|| Status::new(Code::ShuttingDown, "manager not running"))
    }

    fn attach(&self, inner: Arc<Inner>) -> Result<(), ManagerError> {
        let mut s = self.inner.write();
        if s.is_some() {
            return Err(ManagerError::SlotTaken);
        }
        *s = Some(inner);
        Ok(())
    }

    fn detach(&self, inner: &Arc<Inner>) {
        let mut s = self.inner.write();
        if s.as_ref().is_some_and(|cur| Arc::ptr_eq(cur, inner)) {
            *s = None;
        }
    }

    fn is_taken(&self) -> bool {
        self.inner.read().is_some()
    }

    /// The manager's handlers (Raft RPCs, `GetMap`, `Propose`, heartbeats and reports),
    /// to merge into the node's transport router. May be called any number of times,
    /// before or after start; while no manager runs they answer `ShuttingDown`.
    pub fn router(&self) -> Router {
        shingle_transport::name_kind_as(kinds::APPEND_ENTRIES, "RaftAppendEntries");
        shingle_transport::name_kind_as(kinds::VOTE, "RaftVote");
        shingle_transport::name_kind_as(kinds::INSTALL_SNAPSHOT, "RaftInstallSnapshot");
        let s = self.clone();
        let append = move |_: CallContext, payload: Bytes| {
            let m = s.get();
            async move { m?.on_append(payload).await }
        };
        let s = self.clone();
        let vote = move |_: CallContext, payload: Bytes| {
            let m = s.get();
            async move { m?.on_vote(payload).await }
        };
        let s = self.clone();
        let snapshot = move |_: CallContext, payload: Bytes| {
            let m = s.get();
            async move { m?.on_snapshot(payload).await }
        };
        let s = self.clone();
        let get_map = move |_: CallContext, req: GetMapRequest| {
            let m = s.get();
            async move { m?.on_get_map(&req) }
        };
        let s = self.clone();
        let propose = move |ctx: CallContext, req: ProposeRequest| {
            let m = s.get();
            async move { m?.on_propose(&ctx, req).await }
        };
        let s = self.clone();
        let heartbeat = move |ctx: CallContext, req: rpc::HeartbeatRequest| {
            let m = s.get();
            async move { m?.on_heartbeat(&ctx, &req) }
        };
        let s = self.clone();
        let report = move |ctx: CallContext, req: rpc::ReportRequest| {
            let m = s.get();
            async move { m?.on_report(&ctx, req) }
        };
        Router::new()
            .rpc::<rpc::Heartbeat, _, _>(heartbeat)
            .rpc::<rpc::Report, _, _>(report)
            .raw(kinds::APPEND_ENTRIES, append)
            .raw(kinds::VOTE, vote)
            .raw(kinds::INSTALL_SNAPSHOT, snapshot)
            .rpc::<rpc::GetMap, _, _>(get_map)
            .rpc::<rpc::Propose, _, _>(propose)
    }
}

/// Largest cluster-map snapshot a manager accepts (a map of thousands of nodes is a few
/// MiB).
const MAX_SNAPSHOT_BYTES: u64 = 256 << 20;

fn decode_request<T: DeserializeOwned>(payload: &[u8]) -> Result<T, Status> {
    serde_json::from_slice(payload)
        .map_err(|e| Status::new(Code::InvalidRequest, format!("cannot decode raft request: {e}")))
}

fn encode_reply<T: Serialize>(v: &T) -> Result<Bytes, Status> {
    serde_json::to_vec(v)
        .map(Bytes::from)
        .map_err(|e| Status::new(Code::Internal, format!("cannot encode raft reply: {e}")))
}

/// The outcome of one proposal attempt.
enum Attempt {
    /// Committed and applied.
    Done(MapResponse),
    /// Not taken (no leader, leader gone); worth trying again.
    Retry(String),
    /// Failed for good.
    Fail(ManagerError),
}

/// The handlers of the manager's requests (see [`ManagerSlot::router`]).
impl Inner {
    async fn on_append(&self, payload: Bytes) -> Result<Bytes, Status> {
        let req = decode_request(&payload)?;
        let r = self.raft.append_entries(req).await;
        if r.is_ok() {
            *self.leader_heard.lock() = Instant::now();
        }
        encode_reply(&r)
    }

    async fn on_vote(&self, payload: Bytes) -> Result<Bytes, Status> {
        let req = decode_request(&payload)?;
        encode_reply(&self.raft.vote(req).await)
    }

    async fn on_snapshot(&self, payload: Bytes) -> Result<Bytes, Status> {
        let req: InstallSnapshotRequest<TypeConfig> = decode_request(&payload)?;
        // openraft writes a chunk at its offset, filling the gap with zeros: an offset
        // from the request must stay within what a map snapshot can be.
        let end = req.offset.checked_add(req.data.len() as u64);
        if end.is_none_or(|e| e > MAX_SNAPSHOT_BYTES) {
            return Err(Status::new(
                Code::InvalidRequest,
                format!("snapshot chunk past {MAX_SNAPSHOT_BYTES} bytes"),
            ));
        }
        encode_reply(&self.raft.install_snapshot(req).await)
    }

    /// The current map (unless the caller has it), with the maps between the caller's
    /// and it when every one is held.
    fn on_get_map(&self, req: &GetMapRequest) -> Result<GetMapResponse, Status> {
        let map = self.map_rx.borrow().clone();
        if req.known_epoch.is_some_and(|k| k >= map.epoch.0) {
            return Ok(GetMapResponse {
                epoch: map.epoch.0,
                newer: false,
                map_json: String::new(),
                history_json: Vec::new(),
            });
        }
        let encode = |m: &ClusterMap| {
            serde_json::to_string(m).map_err(|e| Status::new(Code::Internal, format!("cannot encode the map: {e}")))
        };
        let history_json = match req.history_from {
            Some(from) if from < map.epoch.0 && map.epoch.0 - from <= rpc::MAX_HISTORY => {
                let chain = self.history.lock().chain(Epoch(from), Epoch(map.epoch.0 - 1));
                match chain {
                    Some(maps) => maps.iter().map(|m| encode(m)).collect::<Result<Vec<_>, _>>()?,
                    None => Vec::new(),
                }
            }
            _ => Vec::new(),
        };
        Ok(GetMapResponse {
            epoch: map.epoch.0,
            newer: true,
            map_json: encode(&map)?,
            history_json,
        })
    }

    /// Commits a command (forwarded to the leader unless it was forwarded here).
    async fn on_propose(&self, ctx: &CallContext, req: ProposeRequest) -> Result<ProposeResponse, Status> {
        let cmd: MapCommand = serde_json::from_str(&req.command_json)
            .map_err(|e| Status::new(Code::InvalidRequest, format!("cannot decode command: {e}")))?;
        debug!(peer = %ctx.peer, forwarded = req.forwarded, ?cmd, "proposal received");
        let registers = match &cmd {
            MapCommand::Register(n) => Some(n.id.0),
            _ => None,
        };
        let outcome = if req.forwarded {
            match self.propose_once(&cmd, false, self.propose_timeout).await {
                Attempt::Done(r) => Ok(r),
                Attempt::Retry(why) => Err(ManagerError::NoLeader {
                    waited: Duration::ZERO,
                    last: why,
                }),
                Attempt::Fail(e) => Err(e),
            }
        } else {
            self.propose(cmd).await
        };
        if let (Some(id), Ok(MapResponse::Applied(_))) = (registers, &outcome) {
            // A node registering is alive now: a heartbeat record left from before it
            // died would have the liveness watch mark it Down again at once (and Up at
            // its next heartbeat: two more epochs that every meta node must follow).
            self.saw(id);
        }
        match outcome {
            Ok(MapResponse::Applied(epoch)) => Ok(ProposeResponse {
                epoch: epoch.0,
                refusal_json: String::new(),
            }),
            Ok(MapResponse::Refused(r)) => Ok(ProposeResponse {
                epoch: self.map_rx.borrow().epoch.0,
                refusal_json: serde_json::to_string(&r)
                    .map_err(|e| Status::new(Code::Internal, format!("cannot encode refusal: {e}")))?,
            }),
            Err(e) => Err(e.to_status()),
        }
    }

    /// A node's (or a client's) heartbeat: the current epoch and leader.
    fn on_heartbeat(&self, ctx: &CallContext, req: &rpc::HeartbeatRequest) -> Result<rpc::HeartbeatResponse, Status> {
        // Only nodes of the map are watched (an unknown id would add an entry that
        // nothing ever removes), and only the cluster's own principal speaks for a
        // node: a client key cannot keep a dead node Up.
        let known = self.map_rx.borrow().nodes.contains_key(&NodeId(req.node_id));
        let node = matches!(*ctx.principal, shingle_transport::auth::Principal::Cluster);
        if req.node_id != 0 && known && node {
            self.saw(req.node_id);
        }
        let (leader, term) = {
            let rm = self.raft.metrics();
            let rm = rm.borrow();
            (rm.current_leader.unwrap_or(0), rm.current_term)
        };
        Ok(rpc::HeartbeatResponse {
            epoch: self.map_rx.borrow().epoch.0,
            leader,
            term,
        })
    }

    /// Nodes a caller could not reach: the leader probes them in the background (the
    /// reporter goes on retrying meanwhile).
    fn on_report(self: Arc<Self>, ctx: &CallContext, req: rpc::ReportRequest) -> Result<rpc::ReportResponse, Status> {
        if self.down_on_refused && self.raft.metrics().borrow().state == ServerState::Leader {
            for id in req.unreachable.into_iter().take(16) {
                tokio::spawn(probe_reported(self.clone(), NodeId(id), ctx.peer));
            }
        }
        Ok(rpc::ReportResponse {})
    }
}

/// State shared by the handle and the handlers.
struct Inner {
    id: u64,
    addr: SocketAddr,
    raft: Raft<TypeConfig>,
    client: PeerClient,
    map_rx: watch::Receiver<ClusterMap>,
    /// The maps the state machine applied, epoch by epoch (recent ones).
    history: Arc<Mutex<crate::map::MapHistory>>,
    propose_timeout: Duration,
    retry_pause: Duration,
    /// Taken by shutdown, which waits until openraft's tasks have let go of it.
    db: Mutex<Option<Arc<redb::Database>>>,
    /// When each node's last heartbeat arrived here, and their intervals.
    last_seen: Mutex<BTreeMap<u64, Seen>>,
    down_after: Duration,
    down_phi: f64,
    pause: Duration,
    out_after: Duration,
    down_on_refused: bool,
    /// When each reported node was last probed (one probe per node per 250 ms).
    probed: Mutex<BTreeMap<u64, Instant>>,
    /// When a probe found each node's address refusing connections: only heartbeats
    /// sent after that bring it back Up (those already in flight came from the dead
    /// process).
    refused: Mutex<BTreeMap<u64, Instant>>,
    /// When the leader's last AppendEntries (a heartbeat) was taken here.
    leader_heard: Mutex<Instant>,
    /// Raft's heartbeat interval and leader lease (the longest election timeout).
    heartbeat: Duration,
    lease: Duration,
}

impl Inner {
    /// Records a sign of life of node `id` (a heartbeat, a registration).
    fn saw(&self, id: u64) {
        let now = Instant::now();
        let mut seen = self.last_seen.lock();
        let e = seen.entry(id).or_insert_with(|| Seen {
            last: now,
            intervals: shingle_transport::health::PhiAccrual::new(Duration::from_millis(100)),
        });
        let gap = now.saturating_duration_since(e.last);
        // A gap longer than the Down limit was an outage, not the node's rhythm.
        if gap > Duration::ZERO && gap < self.down_after {
            e.intervals.record(gap);
        }
        e.last = now;
    }
}

/// Heartbeats of one node as this manager saw them.
struct Seen {
    last: Instant,
    intervals: shingle_transport::health::PhiAccrual,
}

impl Seen {
    /// φ of the silence since the last heartbeat, the usual pause tolerated.
    fn phi(&self, now: Instant, pause: Duration) -> f64 {
        self.intervals
            .phi(now.saturating_duration_since(self.last).saturating_sub(pause))
    }
}

/// Longest wait in [`Manager::shutdown`] for openraft's tasks to release the database.
const RELEASE_WAIT: Duration = Duration::from_secs(5);

impl Inner {
    /// Proposes until a leader commits the command or the deadline passes.
    async fn propose(&self, cmd: MapCommand) -> Result<MapResponse, ManagerError> {
        let started = Instant::now();
        loop {
            let left = self.propose_timeout.saturating_sub(started.elapsed());
            let why = match self.propose_once(&cmd, true, left).await {
                Attempt::Done(r) => return Ok(r),
                Attempt::Fail(e) => return Err(e),
                Attempt::Retry(why) => why,
            };
            let waited = started.elapsed();
            if waited + self.retry_pause >= self.propose_timeout {
                return Err(ManagerError::NoLeader { waited, last: why });
            }
            debug!(reason = %why, "proposal not taken; retrying");
            tokio::time::sleep(self.retry_pause).await;
        }
    }

    /// One attempt: commit locally when leader, else (if `forward`) hand it to the leader.
    async fn propose_once(&self, cmd: &MapCommand, forward: bool, budget: Duration) -> Attempt {
        let write = tokio::time::timeout(budget, self.raft.client_write(cmd.clone())).await;
        let res = match write {
            Ok(r) => r,
            Err(_) => return Attempt::Fail(ManagerError::Uncertain(budget)),
        };
        match res {
            Ok(r) => Attempt::Done(r.data),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                if !forward {
                    return Attempt::Fail(ManagerError::NotLeader { leader: f.leader_id });
                }
                match (f.leader_id, f.leader_node) {
                    (Some(id), Some(node)) if id != self.id => self.forward(id, node.addr, cmd, budget).await,
                    (id, _) => Attempt::Retry(format!("no leader known (last seen: {id:?})")),
                }
            }
            Err(RaftError::APIError(e @ ClientWriteError::ChangeMembershipError(_))) => {
                Attempt::Fail(ManagerError::Raft(e.to_string()))
            }
            Err(RaftError::Fatal(Fatal::Stopped)) => Attempt::Fail(ManagerError::Stopped),
            Err(RaftError::Fatal(f)) => Attempt::Fail(ManagerError::Raft(f.to_string())),
        }
    }

    /// Sends the command to the leader `id` at `addr`.
    async fn forward(&self, id: u64, addr: SocketAddr, cmd: &MapCommand, budget: Duration) -> Attempt {
        let command_json = match serde_json::to_string(cmd) {
            Ok(j) => j,
            Err(e) => return Attempt::Fail(ManagerError::Config(format!("cannot encode command: {e}"))),
        };
        let req = ProposeRequest {
            command_json,
            forwarded: true,
        };
        debug!(leader = id, %addr, "forwarding proposal to the leader");
        match self
            .client
            .call::<rpc::Propose>(addr, &req, CallOptions::timeout(budget.max(Duration::from_millis(1))))
            .await
        {
            Ok(resp) => match calls::decode_propose(addr, resp) {
                Ok(r) => Attempt::Done(r),
                Err(e) => Attempt::Fail(e),
            },
            Err(e)
                if e.status().is_some_and(|s| {
                    s.code == Code::Application && matches!(s.app_code, app_code::NOT_LEADER | app_code::NO_LEADER)
                }) =>
            {
                Attempt::Retry(format!("manager {id} at {addr} is not the leader any more"))
            }
            Err(e)
                if e.status()
                    .is_some_and(|s| s.code == Code::Application && s.app_code == app_code::UNCERTAIN) =>
            {
                Attempt::Fail(ManagerError::Uncertain(budget))
            }
            Err(e) if network::unreachable(&e) => Attempt::Retry(format!("leader {id} at {addr}: {e}")),
            Err(e) => Attempt::Fail(ManagerError::Transport(e)),
        }
    }
}

/// A running manager. Clones share it; [`Manager::shutdown`] stops it for all of them.
/// Dropping every handle without shutting down leaves the Raft member running (its slot
/// still serves it) until the runtime stops.
#[derive(Clone)]
pub struct Manager {
    inner: Arc<Inner>,
    slot: ManagerSlot,
}

impl Manager {
    /// Opens the manager's database in `config.dir` and starts its Raft member, with a slot
    /// of its own; serve [`Manager::router`] on `config.addr`.
    ///
    /// `initial_map` is the map before the first command (the format parameters, epoch 0).
    /// Every manager of the cluster must be given the same one, since each applies the log
    /// to it; on restart the map on disk is used and `initial_map` only checks that the
    /// directory belongs to this cluster.
    pub async fn start(
        config: ManagerConfig,
        client: PeerClient,
        initial_map: ClusterMap,
    ) -> Result<Manager, ManagerError> {
        Self::start_in(&ManagerSlot::new(), config, client, initial_map).await
    }

    /// Like [`Manager::start`], serving through `slot`, whose router may already be bound.
    pub async fn start_in(
        slot: &ManagerSlot,
        config: ManagerConfig,
        client: PeerClient,
        initial_map: ClusterMap,
    ) -> Result<Manager, ManagerError> {
        config.validate()?;
        if slot.is_taken() {
            return Err(ManagerError::SlotTaken);
        }
        let raft_config = Arc::new(config.raft_config(&initial_map.cluster_id)?);
        let (dir, id) = (config.dir.clone(), config.node_id);
        let (db, loaded) = tokio::task::spawn_blocking(move || -> Result<_, store::DbError> {
            let db = store::open(&dir, id)?;
            let loaded = store::load_state(&db)?;
            Ok((db, loaded))
        })
        .await
        .map_err(|e| ManagerError::Storage(format!("cannot open the manager database: {e}")))??;
        let state = match loaded {
            Some(s) if s.map.cluster_id != initial_map.cluster_id => {
                return Err(ManagerError::WrongCluster {
                    found: s.map.cluster_id,
                    expected: initial_map.cluster_id,
                });
            }
            Some(s) => s,
            None => SmState::initial(initial_map),
        };
        let recovered = state.last_applied;
        let (map_tx, map_rx) = watch::channel(state.map.clone());
        let history = Arc::new(Mutex::new(crate::map::MapHistory::default()));
        let network = Network::new(client.clone(), Duration::from_millis(config.heartbeat_ms * 2));
        let raft = Raft::new(
            config.node_id,
            raft_config,
            network,
            LogStore::new(db.clone()),
            StateMachine::new(db.clone(), state, map_tx, history.clone()),
        )
        .await
        .map_err(|e| ManagerError::Raft(format!("cannot start: {e}")))?;
        let inner = Arc::new(Inner {
            id: config.node_id,
            addr: config.addr,
            raft,
            client,
            map_rx,
            history,
            propose_timeout: Duration::from_millis(config.propose_timeout_ms),
            retry_pause: Duration::from_millis(config.heartbeat_ms.max(10)),
            db: Mutex::new(Some(db)),
            last_seen: Mutex::new(BTreeMap::new()),
            down_after: Duration::from_millis(config.down_after_ms),
            down_phi: config.down_phi,
            pause: Duration::from_millis(config.heartbeat_pause_ms),
            out_after: Duration::from_millis(config.out_after_ms),
            down_on_refused: config.down_on_refused,
            probed: Mutex::new(BTreeMap::new()),
            refused: Mutex::new(BTreeMap::new()),
            leader_heard: Mutex::new(Instant::now()),
            heartbeat: Duration::from_millis(config.heartbeat_ms),
            lease: Duration::from_millis(config.election_timeout_max_ms),
        });
        if let Err(e) = slot.attach(inner.clone()) {
            let _ = inner.raft.shutdown().await;
            return Err(e);
        }
        tokio::spawn(log_role_changes(inner.raft.metrics()));
        tokio::spawn(watch_liveness(Arc::downgrade(&inner)));
        tokio::spawn(elect_when_leader_gone(Arc::downgrade(&inner)));
        let epoch = inner.map_rx.borrow().epoch;
        info!(
            id = config.node_id,
            addr = %config.addr,
            dir = %config.dir.display(),
            ?epoch,
            last_applied = ?recovered,
            "manager started"
        );
        Ok(Manager {
            inner,
            slot: slot.clone(),
        })
    }

    /// The manager's handlers, to merge into the transport server on [`ManagerConfig::addr`].
    pub fn router(&self) -> Router {
        self.slot.router()
    }

    /// This member's id.
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// Forms the group with `members` (id → manager address), this one included. Used once,
    /// by `shingle format`, on one manager; returns `Ok` without change when this manager
    /// already belongs to a group.
    pub async fn initialize(&self, members: BTreeMap<u64, SocketAddr>) -> Result<(), ManagerError> {
        match members.get(&self.inner.id) {
            None => {
                return Err(ManagerError::Config(format!(
                    "the initial members must include this manager ({})",
                    self.inner.id
                )));
            }
            Some(a) if *a != self.inner.addr => {
                return Err(ManagerError::Config(format!(
                    "the initial members give this manager address {a}, it serves on {}",
                    self.inner.addr
                )));
            }
            Some(_) => {}
        }
        let nodes: BTreeMap<u64, ManagerNode> = members
            .iter()
            .map(|(id, addr)| (*id, ManagerNode { addr: *addr }))
            .collect();
        // Asking first keeps openraft from logging the refusal of a second initialize as an error.
        match self.inner.raft.is_initialized().await {
            Ok(true) => {
                info!("manager group already initialised");
                return Ok(());
            }
            Ok(false) => {}
            Err(Fatal::Stopped) => return Err(ManagerError::Stopped),
            Err(f) => return Err(ManagerError::Raft(f.to_string())),
        }
        match self.inner.raft.initialize(nodes).await {
            Ok(()) => {
                info!(members = ?members, "manager group initialised");
                Ok(())
            }
            Err(RaftError::APIError(InitializeError::NotAllowed(e))) => {
                info!(reason = %e, "manager group already initialised");
                Ok(())
            }
            Err(RaftError::APIError(InitializeError::NotInMembers(e))) => Err(ManagerError::Config(e.to_string())),
            Err(RaftError::Fatal(Fatal::Stopped)) => Err(ManagerError::Stopped),
            Err(RaftError::Fatal(f)) => Err(ManagerError::Raft(f.to_string())),
        }
    }

    /// Commits `cmd` and returns the map's epoch after it. Works on any member: a follower
    /// forwards to the leader, and elections in progress are waited out, up to
    /// [`ManagerConfig::propose_timeout_ms`].
    pub async fn propose(&self, cmd: MapCommand) -> Result<Epoch, ManagerError> {
        Ok(self.inner.propose(cmd).await?.into_result()?)
    }

    /// This manager's applied copy of the map (a follower's may trail by a heartbeat).
    pub fn map(&self) -> ClusterMap {
        self.inner.map_rx.borrow().clone()
    }

    /// A receiver that sees every map this manager applies.
    pub fn watch(&self) -> watch::Receiver<ClusterMap> {
        self.inner.map_rx.clone()
    }

    /// True when this manager believes it leads (as of its last heartbeat round).
    pub fn is_leader(&self) -> bool {
        self.inner.raft.metrics().borrow().state == ServerState::Leader
    }

    /// The leader this manager knows of.
    pub fn leader(&self) -> Option<u64> {
        self.inner.raft.metrics().borrow().current_leader
    }

    /// A snapshot of the Raft state, for monitoring.
    pub fn metrics(&self) -> ManagerMetrics {
        let m = self.inner.raft.metrics().borrow().clone();
        ManagerMetrics {
            id: m.id,
            role: m.state.into(),
            term: m.current_term,
            leader: m.current_leader,
            last_log_index: m.last_log_index,
            last_applied_index: m.last_applied.map(|l| l.index),
            snapshot_index: m.snapshot.map(|l| l.index),
            epoch: self.inner.map_rx.borrow().epoch,
            voters: m.membership_config.voter_ids().collect(),
        }
    }

    /// Waits until some leader is known; returns its id.
    pub async fn wait_for_leader(&self, timeout: Duration) -> Result<u64, ManagerError> {
        let mut rx = self.inner.raft.metrics();
        let wait = async {
            loop {
                if let Some(l) = rx.borrow_and_update().current_leader {
                    return Ok(l);
                }
                if rx.changed().await.is_err() {
                    return Err(ManagerError::Stopped);
                }
            }
        };
        tokio::time::timeout(timeout, wait)
            .await
            .map_err(|_| ManagerError::Timeout {
                waited: timeout,
                what: "a manager leader",
            })?
    }

    /// Waits until this manager has applied a map of at least `epoch`; returns it.
    pub async fn wait_for_epoch(&self, epoch: Epoch, timeout: Duration) -> Result<ClusterMap, ManagerError> {
        let mut rx = self.inner.map_rx.clone();
        tokio::time::timeout(timeout, rx.wait_for(|m| m.epoch >= epoch))
            .await
            .map_err(|_| ManagerError::Timeout {
                waited: timeout,
                what: "the map epoch",
            })?
            .map(|m| m.clone())
            .map_err(|_| ManagerError::Stopped)
    }

    /// Stops the Raft member, detaches from the slot (its router then answers
    /// `ShuttingDown`) and closes the database, so the directory can be opened again.
    pub async fn shutdown(&self) {
        self.slot.detach(&self.inner);
        if let Err(e) = self.inner.raft.shutdown().await {
            warn!(error = %e, "manager raft task ended abnormally");
        }
        let db = self.inner.db.lock().take();
        if let Some(db) = db {
            let started = Instant::now();
            while Arc::strong_count(&db) > 1 && started.elapsed() < RELEASE_WAIT {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            if Arc::strong_count(&db) > 1 {
                warn!(
                    dir_users = Arc::strong_count(&db) - 1,
                    "manager database still in use after shutdown"
                );
            }
            drop(db);
            info!(id = self.inner.id, "manager stopped");
        }
    }
}

/// On the leader: marks a node Down when its heartbeat silence reaches φ = `down_phi`
/// (or `down_after`, whichever comes first), Out when it has been Down for `out_after`,
/// and Up again when its heartbeats resume. A new leader gives every node a full
/// `down_after` first (it may have missed their heartbeats).
async fn watch_liveness(inner: std::sync::Weak<Inner>) {
    use crate::map::NodeState;
    let mut leader_since: Option<Instant> = None;
    // When each node was first seen Down by this leader.
    let mut down_since: BTreeMap<u64, Instant> = BTreeMap::new();
    let Some(mut metrics) = inner.upgrade().map(|m| m.raft.metrics()) else {
        return;
    };
    let mut tick = tokio::time::Instant::now();
    loop {
        // Every 100 ms, and at once when this member becomes leader: the nodes the old
        // leader died with are probed without waiting for the next tick.
        tick += Duration::from_millis(100);
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(tick) => break,
                r = metrics.changed() => {
                    if r.is_err() {
                        return;
                    }
                    let leads = metrics.borrow_and_update().state == ServerState::Leader;
                    if leads && leader_since.is_none() {
                        break;
                    }
                }
            }
        }
        tick = tick.max(tokio::time::Instant::now());
        let Some(m) = inner.upgrade() else { return };
        if m.raft.metrics().borrow().state != ServerState::Leader {
            leader_since = None;
            down_since.clear();
            continue;
        }
        let now = Instant::now();
        let newly = leader_since.is_none();
        let since = *leader_since.get_or_insert(now);
        let map = m.map_rx.borrow().clone();
        if newly && m.down_on_refused {
            // Just elected: the old leader may have died, and nodes may have died with
            // nobody to report them to. Whoever no longer listens is Down now, not after
            // `down_after` of silence (their partitions wait for it).
            for n in map.nodes.values() {
                if n.state == NodeState::Up && n.id.0 != m.id {
                    tokio::spawn(probe_reported(m.clone(), n.id, m.addr));
                }
            }
        }
        let changes = liveness_changes(&m, &map, since, now, &mut down_since);
        for (id, state, silent, phi) in changes {
            info!(
                node = id.0,
                ?state,
                silent_ms = silent.as_millis() as u64,
                phi = format!("{phi:.1}"),
                "node liveness changed"
            );
            if let Err(e) = m.propose(MapCommand::SetState { id, state }).await {
                debug!(node = id.0, error = %e, "cannot record liveness change");
            }
        }
    }
}

/// The liveness changes the leader should record now (leading since `since`): a node
/// silent for `down_after` (or, after a grace, suspected by its phi) goes Down, one
/// heard from again comes Up, one Down for `out_after` goes Out. `down_since` keeps
/// when each node was first seen Down by this leader.
fn liveness_changes(
    m: &Inner,
    map: &ClusterMap,
    since: Instant,
    now: Instant,
    down_since: &mut BTreeMap<u64, Instant>,
) -> Vec<(NodeId, crate::map::NodeState, Duration, f64)> {
    use crate::map::NodeState;
    let mut changes = Vec::new();
    let seen = m.last_seen.lock();
    let mut refused = m.refused.lock();
    refused.retain(|_, t| now.saturating_duration_since(*t) < Duration::from_secs(10));
    for n in map.nodes.values() {
        let s = seen.get(&n.id.0);
        let last = s.map_or(since, |s| s.last).max(since);
        let silent = now.saturating_duration_since(last);
        let fresh = s.is_some_and(|s| {
            now.saturating_duration_since(s.last) < Duration::from_secs(1)
                && refused.get(&n.id.0).is_none_or(|t| s.last > *t)
        });
        match n.state {
            NodeState::Up => {
                let phi = s.map_or(0.0, |s| s.phi(now, m.pause));
                let grace = now.saturating_duration_since(since) >= m.down_after;
                // Never before the node itself notices lost touch (1.5 s) and
                // stops serving: 2 s at least.
                let floor = silent >= Duration::from_secs(2);
                if silent >= m.down_after || (grace && floor && phi >= m.down_phi) {
                    changes.push((n.id, NodeState::Down, silent, phi));
                }
            }
            NodeState::Down | NodeState::Out if fresh => changes.push((n.id, NodeState::Up, silent, 0.0)),
            NodeState::Down => {
                let at = *down_since.entry(n.id.0).or_insert(now);
                if !m.out_after.is_zero() && now.saturating_duration_since(at) >= m.out_after {
                    changes.push((n.id, NodeState::Out, silent, 0.0));
                }
            }
            NodeState::Out => {}
        }
        if n.state != NodeState::Down {
            down_since.remove(&n.id.0);
        }
    }
    changes
}

/// On a follower: when the leader's heartbeats stop and its address refuses
/// connections (nothing listens: the process is gone), calls an election as soon as
/// the leader's lease has run out, instead of after the lease *and* a randomized
/// election timeout (openraft 0.9 waits both; voters refuse any candidate within the
/// lease). Every mutation of a partition the dead leader's node was a member of waits
/// for the map the next leader publishes, so this is time those mutations stall. The
/// followers are staggered by id (30 ms apart) so that two do not split the vote, and
/// one that was asked for its vote meanwhile stands back. A leader that merely went
/// quiet (slow, cut off) is left to Raft's own timers.
async fn elect_when_leader_gone(inner: std::sync::Weak<Inner>) {
    let Some((heartbeat, lease)) = inner.upgrade().map(|m| (m.heartbeat, m.lease)) else {
        return;
    };
    loop {
        tokio::time::sleep(heartbeat).await;
        let Some(m) = inner.upgrade() else { return };
        let (state, leader, addr, term) = {
            let rm = m.raft.metrics().borrow().clone();
            let leader = rm.current_leader.filter(|l| *l != m.id);
            let addr = leader.and_then(|l| {
                rm.membership_config
                    .nodes()
                    .find(|(id, _)| **id == l)
                    .map(|(_, n)| n.addr)
            });
            (rm.state, leader, addr, rm.current_term)
        };
        let (Some(leader), Some(addr), ServerState::Follower) = (leader, addr, state) else {
            continue;
        };
        let heard = *m.leader_heard.lock();
        if heard.elapsed() < m.heartbeat * 2 {
            continue;
        }
        if probe(addr, m.heartbeat).await != Probe::Refused {
            continue;
        }
        // 50 ms past our own lease: the other voters heard the leader's last heartbeat a
        // little later than we did, and refuse any candidate until theirs ran out too.
        let stagger = Duration::from_millis(50 + 30 * (m.id % 4));
        drop(m);
        tokio::time::sleep_until((heard + lease + stagger).into()).await;
        let Some(m) = inner.upgrade() else { return };
        // Nobody else began campaigning meanwhile (a vote asked of this member raised
        // its term): a second candidate would only split the vote.
        let still = *m.leader_heard.lock() == heard
            && m.raft.metrics().borrow().current_leader == Some(leader)
            && m.raft.metrics().borrow().current_term == term;
        if still {
            info!(leader, "the leader's address refuses connections; calling an election");
            let _ = m.raft.trigger().elect().await;
            drop(m);
            // Raft's own timers take it from here if this one does not settle it.
            tokio::time::sleep(lease * 2).await;
        }
    }
}

/// What a TCP connect to a peer's address tells of its process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Probe {
    /// Nothing listens there: the process is gone (its host answered for it).
    Refused,
    /// Something accepted the connection (possibly a process being killed).
    Accepted,
    /// Timed out or failed otherwise: the host may be cut off, or busy.
    Unknown,
}

/// Connects to `addr` once, for at most `wait`.
async fn probe(addr: SocketAddr, wait: Duration) -> Probe {
    match tokio::time::timeout(wait, tokio::net::TcpStream::connect(addr)).await {
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => Probe::Refused,
        Ok(Ok(_)) => Probe::Accepted,
        _ => Probe::Unknown,
    }
}

/// On the leader: a node reported unreachable by `by` is probed with a TCP connect; a
/// refused connection means no process listens at its address, so it is marked Down
/// now rather than after `down_after` of heartbeat silence (partitions it led get a new
/// primary within a round trip of the map). A probe that connects is tried again 50,
/// 100 and 200 ms later: a process being killed still accepts connections for a moment
/// after its peers saw theirs reset (a reported node "answered" that way and was left
/// to the heartbeat detector, so partitions it was a member of stalled their writes
/// for half a second until the next report). A probe that times out, or connects every
/// time, proves nothing and leaves the node to the heartbeat detector. A node is probed
/// at most every 250 ms.
async fn probe_reported(m: Arc<Inner>, id: NodeId, by: SocketAddr) {
    use crate::map::NodeState;
    let addr = match m.map_rx.borrow().nodes.get(&id) {
        Some(n) if n.state == NodeState::Up => n.addr,
        _ => return,
    };
    {
        let now = Instant::now();
        let mut probed = m.probed.lock();
        if probed
            .get(&id.0)
            .is_some_and(|t| now.saturating_duration_since(*t) < Duration::from_millis(250))
        {
            return;
        }
        probed.insert(id.0, now);
    }
    let mut refused = false;
    for again in [0, 50, 100, 200] {
        tokio::time::sleep(Duration::from_millis(again)).await;
        match probe(addr, Duration::from_millis(500)).await {
            Probe::Refused => {
                refused = true;
                break;
            }
            Probe::Accepted => {}
            // Nothing to learn from trying again soon.
            Probe::Unknown => break,
        }
    }
    if !refused {
        debug!(node = id.0, %addr, reporter = %by, "reported node answers or cannot be told; left to heartbeats");
        return;
    }
    let still_up = m
        .map_rx
        .borrow()
        .nodes
        .get(&id)
        .is_some_and(|n| n.state == NodeState::Up);
    if !still_up || m.raft.metrics().borrow().state != ServerState::Leader {
        return;
    }
    m.refused.lock().insert(id.0, Instant::now());
    info!(node = id.0, %addr, reporter = %by, state = ?NodeState::Down, "node liveness changed: connection refused");
    if let Err(e) = m
        .propose(MapCommand::SetState {
            id,
            state: NodeState::Down,
        })
        .await
    {
        debug!(node = id.0, error = %e, "cannot record liveness change");
    }
}

/// Logs each change of role or leader once, until the Raft member stops.
async fn log_role_changes(mut rx: watch::Receiver<openraft::RaftMetrics<u64, ManagerNode>>) {
    let mut last = None;
    loop {
        let now = {
            let m = rx.borrow_and_update();
            (m.state, m.current_leader, m.current_term)
        };
        if last.is_none_or(|(s, l, _)| (s, l) != (now.0, now.1)) {
            info!(role = ?now.0, leader = ?now.1, term = now.2, "manager role");
            last = Some(now);
        }
        if rx.changed().await.is_err() {
            return;
        }
    }
}
