//! The cluster map: nodes, metadata partitions, data placement groups and the epoch.
//!
//! The map is a deterministic state machine: [`ClusterMap::apply`] takes a
//! [`MapCommand`] and bumps the epoch when anything changed. The manager replicates the
//! commands with Raft; every node and client holds a copy and refreshes it when a peer
//! answers "stale map". Replica lists are derived from the map ([`Placement`]), never
//! stored, so two holders of the same epoch always agree.

use crate::ids::{Epoch, NodeId, PartitionId, PgId};
use crate::placement::{self, Candidate};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;

mod view;
pub use view::{HISTORY_MAPS, MapHistory, MapView};

/// Roles a node plays.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Roles {
    /// Member of the manager Raft group.
    pub manager: bool,
    /// Holds metadata partitions.
    pub meta: bool,
    /// Holds chunks.
    pub data: bool,
}

/// Liveness of a node as the manager sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeState {
    /// Serving.
    Up,
    /// Missed heartbeats: its replicas are skipped (others are promoted), its data stays
    /// placed on it.
    Down,
    /// Gone for good: removed from placement; its data is rebuilt elsewhere.
    Out,
}

/// One node in the map.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// Its id.
    pub id: NodeId,
    /// RPC address.
    pub addr: SocketAddr,
    /// Roles.
    pub roles: Roles,
    /// Failure domain.
    pub domain: String,
    /// Liveness.
    pub state: NodeState,
}

impl NodeInfo {
    /// A metadata-only node (no manager, no data) in failure domain `d<id>`.
    pub fn meta_only(id: NodeId, addr: SocketAddr, state: NodeState) -> NodeInfo {
        NodeInfo {
            id,
            addr,
            roles: Roles {
                manager: false,
                meta: true,
                data: false,
            },
            domain: format!("d{}", id.0),
            state,
        }
    }
}

/// A change to the map.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MapCommand {
    /// Adds a node, or updates its address/roles/domain (it comes back Up).
    Register(NodeInfo),
    /// Sets a node's state.
    SetState {
        /// The node.
        id: NodeId,
        /// New state.
        state: NodeState,
    },
    /// Removes a node that is Out.
    Remove {
        /// The node.
        id: NodeId,
    },
    /// The primary of moving partitions saw every one of their replicas make a batch
    /// durable in map epoch `checked_in`: they leave their earlier holders (see
    /// [`PartitionMove`]). A partition whose replicas, or their states, changed after
    /// `checked_in` stays as it is.
    MoveDone {
        /// The partitions.
        partitions: Vec<PartitionId>,
        /// The epoch their primary checked every replica in.
        checked_in: Epoch,
    },
    /// Grants client `name` a key (a new serial: the keys of its earlier grants stop
    /// working), with what it may do.
    GrantClient {
        /// `[A-Za-z0-9._-]`, 1 to 32 bytes.
        name: String,
        /// Write (else read only).
        write: bool,
        /// uid 0 acts as nobody (65534).
        root_squash: bool,
        /// Every uid acts as this uid and gid (NFS `all_squash` with `anonuid`/`anongid`):
        /// a tenant's hosts cannot act as anyone else whatever they assert.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        act_as: Option<(u32, u32)>,
        /// Confined to this directory and what lies below it (cephx `path=`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        subtree: Option<Subtree>,
    },
    /// Revokes client `name`'s key.
    RevokeClient {
        /// The client.
        name: String,
    },
}

/// What a client key may do ([`ClusterMap::clients`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientGrant {
    /// The serial its key is made with; earlier serials are dead.
    pub serial: u64,
    /// Revoked: no serial of this name works (until granted again).
    pub revoked: bool,
    /// May change the namespace and write data; else read only.
    pub write: bool,
    /// Its uid 0 acts as uid/gid 65534.
    pub root_squash: bool,
    /// Every uid of it acts as this uid and gid (overrides `root_squash`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub act_as: Option<(u32, u32)>,
    /// Sees and changes only this directory and what lies below it; its mounts are
    /// rooted there. `None`: the whole tree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subtree: Option<Subtree>,
}

/// The directory a client key is confined to ([`ClientGrant::subtree`]). The grant
/// names the directory, not the path: renamed, the directory takes its clients along.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subtree {
    /// The directory.
    pub root: crate::ids::Ino,
    /// Its path when granted (shown by `shingle client list`).
    pub path: String,
}

impl ClientGrant {
    /// The credentials a request of this client runs with, given what it asserts.
    pub fn squash(&self, creds: &mut crate::namespace::Creds) {
        let (uid, gid) = match self.act_as {
            Some(ids) => ids,
            None if self.root_squash && creds.uid == 0 => (SQUASHED_ID, SQUASHED_ID),
            None => return,
        };
        *creds = only(uid, gid);
    }
}

/// The credentials of nobody: a squashed root, or a client whose grant went away.
pub fn nobody() -> crate::namespace::Creds {
    only(SQUASHED_ID, SQUASHED_ID)
}

fn only(uid: u32, gid: u32) -> crate::namespace::Creds {
    crate::namespace::Creds {
        uid,
        gid,
        groups: Vec::new(),
    }
}

/// The uid and gid a squashed root acts as (nobody, nogroup).
pub const SQUASHED_ID: u32 = 65534;

/// A metadata partition whose placement moved (a node joined, left, or changed domain):
/// its earlier replicas stay replicas, first in order, beside the new ones, until its
/// primary has shown every replica holds the partition ([`MapCommand::MoveDone`]).
///
/// Without it a join could move a partition away from its only up-to-date copies:
/// with two of three replicas Down, batches are acknowledged by the one left, and when
/// placement drops that one the new replicas can only start from what the Down ones
/// held (found by the simulator: `shingle sim --seed 59 --nodes 8 --partitions 8 --ops 300
/// --clients 6 --ns-clients 0 --max-down 2 --joins 3`). Ceph keeps a placement group's
/// acting set (pg_temp) on its old OSDs while it backfills, for the same reason.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionMove {
    /// The replicas the partition had before it moved, in their order.
    pub holders: Vec<NodeId>,
    /// The last epoch that changed the partition's replicas, their states or where it is
    /// moving to: a [`MapCommand::MoveDone`] checked before it changes nothing.
    pub since: Epoch,
}

/// Why a command was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MapError {
    /// No such node.
    #[error("{0} is not in the cluster map")]
    UnknownNode(NodeId),
    /// Only Out nodes may be removed.
    #[error("{0} must be out before it is removed")]
    NotOut(NodeId),
    /// Another node already uses that address.
    #[error("address {addr} already belongs to {other}")]
    AddressInUse {
        /// The address.
        addr: SocketAddr,
        /// Its owner.
        other: NodeId,
    },
    /// A client name that cannot name a key.
    #[error("bad client name {0:?}: 1 to 32 of A-Z a-z 0-9 . _ -")]
    BadClientName(String),
    /// Revoking a client never granted.
    #[error("no client {0:?} was ever granted a key")]
    UnknownClient(String),
}

/// The cluster map.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterMap {
    /// Random id chosen at format time; nodes refuse maps of another cluster.
    pub cluster_id: String,
    /// Increases on every change.
    pub epoch: Epoch,
    /// Metadata partitions (fixed at format).
    pub partitions: u32,
    /// Data placement groups (fixed at format).
    pub pgs: u32,
    /// Metadata replicas per partition.
    pub replication: u8,
    /// Nodes placed in each data placement group (the widest stripe, k+m).
    pub pg_width: u8,
    /// The nodes.
    pub nodes: BTreeMap<NodeId, NodeInfo>,
    /// Partitions still held by their replicas from before a placement change.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub moves: BTreeMap<PartitionId, PartitionMove>,
    /// Client keys ever granted, by name (revoked ones stay, so their serials are
    /// never handed out again).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub clients: BTreeMap<String, ClientGrant>,
}

impl ClusterMap {
    /// A new, empty map (epoch 0).
    pub fn new(cluster_id: impl Into<String>, partitions: u32, pgs: u32, replication: u8, pg_width: u8) -> Self {
        ClusterMap {
            cluster_id: cluster_id.into(),
            epoch: Epoch(0),
            partitions,
            pgs,
            replication,
            pg_width,
            nodes: BTreeMap::new(),
            moves: BTreeMap::new(),
            clients: BTreeMap::new(),
        }
    }

    /// The grant of a client key of `name` and `serial`, when it is live.
    pub fn client(&self, name: &str, serial: u64) -> Option<&ClientGrant> {
        self.clients.get(name).filter(|g| g.serial == serial && !g.revoked)
    }

    /// Applies a command; returns the new epoch (unchanged when the command changed nothing).
    pub fn apply(&mut self, cmd: &MapCommand) -> Result<Epoch, MapError> {
        // What placement was before a change of nodes, to see which partitions move.
        let before = match cmd {
            MapCommand::MoveDone { .. } | MapCommand::GrantClient { .. } | MapCommand::RevokeClient { .. } => None,
            _ => Some(self.clone()),
        };
        let changed = match cmd {
            MapCommand::Register(info) => self.register(info)?,
            MapCommand::SetState { id, state } => {
                let n = self.nodes.get_mut(id).ok_or(MapError::UnknownNode(*id))?;
                let changed = n.state != *state;
                n.state = *state;
                changed
            }
            MapCommand::Remove { id } => {
                let n = self.nodes.get(id).ok_or(MapError::UnknownNode(*id))?;
                if n.state != NodeState::Out {
                    return Err(MapError::NotOut(*id));
                }
                self.nodes.remove(id);
                true
            }
            MapCommand::MoveDone { partitions, checked_in } => {
                let before = self.moves.len();
                for p in partitions {
                    if self.moves.get(p).is_some_and(|m| m.since <= *checked_in) {
                        self.moves.remove(p);
                    }
                }
                self.moves.len() != before
            }
            MapCommand::GrantClient {
                name,
                write,
                root_squash,
                act_as,
                subtree,
            } => {
                let grant = ClientGrant {
                    serial: self.clients.get(name).map_or(0, |g| g.serial) + 1,
                    revoked: false,
                    write: *write,
                    root_squash: *root_squash,
                    act_as: *act_as,
                    subtree: subtree.clone(),
                };
                self.grant(name, grant)?
            }
            MapCommand::RevokeClient { name } => {
                let g = self
                    .clients
                    .get_mut(name)
                    .ok_or_else(|| MapError::UnknownClient(name.chars().take(64).collect()))?;
                !std::mem::replace(&mut g.revoked, true)
            }
        };
        if changed {
            self.epoch = Epoch(self.epoch.0 + 1);
            if let Some(before) = before {
                let node = match cmd {
                    MapCommand::Register(n) => n.id,
                    MapCommand::SetState { id, .. } | MapCommand::Remove { id } => *id,
                    MapCommand::MoveDone { .. } | MapCommand::GrantClient { .. } | MapCommand::RevokeClient { .. } => {
                        unreachable!("no node changes")
                    }
                };
                self.track_moves(&before, node);
            }
        }
        Ok(self.epoch)
    }

    /// Registers a node (Up), refusing an address another node has: whether the map
    /// changed.
    fn register(&mut self, info: &NodeInfo) -> Result<bool, MapError> {
        if let Some(other) = self.nodes.values().find(|n| n.addr == info.addr && n.id != info.id) {
            return Err(MapError::AddressInUse {
                addr: info.addr,
                other: other.id,
            });
        }
        let mut info = info.clone();
        info.state = NodeState::Up;
        Ok(self.nodes.insert(info.id, info.clone()) != Some(info))
    }

    /// Grants client key `name` (a new serial: keys of the old one stop working), if
    /// the name makes a valid identity.
    fn grant(&mut self, name: &str, grant: ClientGrant) -> Result<bool, MapError> {
        shingle_transport::auth::Identity::new(name, grant.serial)
            .map_err(|_| MapError::BadClientName(name.chars().take(64).collect()))?;
        self.clients.insert(name.to_string(), grant);
        Ok(true)
    }

    /// The metadata candidates: nodes with the meta role that are not Out.
    fn meta_candidates(&self) -> Vec<Candidate<'_>> {
        self.candidates(|r| r.meta)
    }

    /// The nodes placement may choose for a role: those that have it and are not Out.
    fn candidates(&self, pick: fn(&Roles) -> bool) -> Vec<Candidate<'_>> {
        self.nodes
            .values()
            .filter(|n| n.state != NodeState::Out && pick(&n.roles))
            .map(|n| Candidate {
                id: n.id,
                domain: n.domain.as_str(),
            })
            .collect()
    }

    /// Where rendezvous hashing places partition `p` (moves aside).
    fn wanted(&self, candidates: &[Candidate<'_>], p: u32) -> Vec<NodeId> {
        placement::place(
            placement::KIND_PARTITION,
            u64::from(p),
            candidates,
            usize::from(self.replication),
        )
    }

    /// The replicas of partition `p`: its earlier holders first while it moves.
    fn replicas(&self, candidates: &[Candidate<'_>], p: u32) -> Vec<NodeId> {
        let wanted = self.wanted(candidates, p);
        match self.moves.get(&PartitionId(p)) {
            None => wanted,
            Some(m) => {
                let mut all = m.holders.clone();
                all.extend(wanted.into_iter().filter(|n| !m.holders.contains(n)));
                all
            }
        }
    }

    /// After `node` changed (this map's epoch was just bumped): partitions whose wanted
    /// replicas no longer include every holder start moving; moves whose replicas
    /// include `node`, or whose destination changed, restart their check.
    fn track_moves(&mut self, before: &ClusterMap, node: NodeId) {
        let old_candidates = before.meta_candidates();
        let candidates = self.meta_candidates();
        let epoch = self.epoch;
        if old_candidates == candidates {
            let touched: Vec<PartitionId> = self
                .moves
                .iter()
                .filter(|(p, m)| m.holders.contains(&node) || self.wanted(&candidates, p.0).contains(&node))
                .map(|(p, _)| *p)
                .collect();
            drop(candidates);
            for p in touched {
                if let Some(m) = self.moves.get_mut(&p) {
                    m.since = epoch;
                }
            }
            return;
        }
        // A candidate added and nothing else changed (a join): a partition whose wanted
        // replicas do not include it is placed as before (rendezvous hashing), so only
        // those that do (about R/N of them) need the old placement worked out.
        let added = (candidates.len() == old_candidates.len() + 1)
            .then(|| candidates.iter().find(|c| !old_candidates.contains(c)))
            .flatten()
            .map(|c| c.id)
            .filter(|_| old_candidates.iter().all(|c| candidates.contains(c)));
        let mut moves = BTreeMap::new();
        for p in 0..self.partitions {
            let wanted = self.wanted(&candidates, p);
            let moving = before.moves.get(&PartitionId(p));
            if moving.is_none() && added.is_some_and(|n| !wanted.contains(&n)) {
                continue;
            }
            // Every replica it had may hold batches the others missed (a moving
            // partition's new replicas too); those that left the candidates (Out,
            // removed, no meta role) hold nothing to wait for.
            let held = before.replicas(&old_candidates, p);
            let holders: Vec<NodeId> = held
                .iter()
                .copied()
                .filter(|n| candidates.iter().any(|c| c.id == *n))
                .collect();
            if holders.iter().all(|n| wanted.contains(n)) {
                continue;
            }
            // A move whose replicas stay the same keeps its check.
            let now = holders.iter().chain(wanted.iter().filter(|n| !holders.contains(n)));
            let since = match moving {
                Some(m) if now.eq(held.iter()) => m.since,
                _ => epoch,
            };
            moves.insert(PartitionId(p), PartitionMove { holders, since });
        }
        drop(candidates);
        self.moves = moves;
    }

    /// The address of a node.
    pub fn addr(&self, id: NodeId) -> Option<SocketAddr> {
        self.nodes.get(&id).map(|n| n.addr)
    }

    /// True when the node is Up.
    pub fn is_up(&self, id: NodeId) -> bool {
        self.nodes.get(&id).is_some_and(|n| n.state == NodeState::Up)
    }

    /// Addresses of the nodes Up here that were not Up in `before` (absent, Down, Out, or
    /// at another address): nodes that came back, which peers may connect to at once.
    pub fn returned_since(&self, before: &ClusterMap) -> Vec<SocketAddr> {
        self.nodes
            .values()
            .filter(|n| n.state == NodeState::Up)
            .filter(|n| {
                before
                    .nodes
                    .get(&n.id)
                    .is_none_or(|b| b.state != NodeState::Up || b.addr != n.addr)
            })
            .map(|n| n.addr)
            .collect()
    }

    /// Derives the placement of every partition and group.
    pub fn placement(&self) -> Placement {
        let meta = self.meta_candidates();
        let data = self.candidates(|r| r.data);
        Placement {
            epoch: self.epoch,
            partitions: (0..self.partitions).map(|p| self.replicas(&meta, p)).collect(),
            pgs: (0..self.pgs)
                .map(|g| placement::place(placement::KIND_PG, u64::from(g), &data, usize::from(self.pg_width)))
                .collect(),
        }
    }
}

impl ClusterMap {
    /// Data nodes that can stand in for members of placement group `g` (a shard whose
    /// node is down or failing goes to one): every Up data node outside `group`, best
    /// rendezvous score first, so all writers of the group agree on the order.
    pub fn pg_spares(&self, g: PgId, group: &[NodeId]) -> Vec<NodeId> {
        let mut spares: Vec<NodeId> = self
            .nodes
            .values()
            .filter(|n| n.state == NodeState::Up && n.roles.data && !group.contains(&n.id))
            .map(|n| n.id)
            .collect();
        spares.sort_by_key(|id| std::cmp::Reverse(placement::score(placement::KIND_PG, u64::from(g.0), *id)));
        spares
    }
}

/// Replica lists derived from one epoch of the map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// The epoch they were derived from.
    pub epoch: Epoch,
    partitions: Vec<Vec<NodeId>>,
    pgs: Vec<Vec<NodeId>>,
}

impl Placement {
    /// Ordered replicas of a metadata partition (Down nodes included, in place).
    pub fn partition(&self, p: PartitionId) -> &[NodeId] {
        self.partitions.get(p.0 as usize).map_or(&[], Vec::as_slice)
    }

    /// Ordered nodes of a placement group: shard i of a stripe goes to node i.
    pub fn pg(&self, g: PgId) -> &[NodeId] {
        self.pgs.get(g.0 as usize).map_or(&[], Vec::as_slice)
    }

    /// Partitions whose replica list contains `node`.
    pub fn partitions_of(&self, node: NodeId) -> Vec<PartitionId> {
        self.partitions
            .iter()
            .enumerate()
            .filter(|(_, r)| r.contains(&node))
            .map(|(i, _)| PartitionId(i as u32))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(i: u64) -> NodeInfo {
        NodeInfo {
            id: NodeId(i),
            addr: SocketAddr::from(([127, 0, 0, 1], 7000 + i as u16)),
            roles: Roles {
                manager: i == 1,
                meta: true,
                data: true,
            },
            domain: format!("host{i}"),
            state: NodeState::Up,
        }
    }

    /// A map of nodes 1..=n whose partitions all settled where they are placed.
    fn formed(partitions: u32, n: u64) -> ClusterMap {
        let mut m = ClusterMap::new("c1", partitions, partitions / 2, 3, 6);
        for i in 1..=n {
            m.apply(&MapCommand::Register(node(i))).expect("register");
            if i <= 3 {
                assert!(m.moves.is_empty(), "placement only grows up to three nodes");
            }
        }
        let partitions = m.moves.keys().copied().collect();
        m.apply(&MapCommand::MoveDone {
            partitions,
            checked_in: m.epoch,
        })
        .expect("done");
        assert!(m.moves.is_empty());
        m
    }

    #[test]
    fn epochs_move_only_on_change_and_commands_are_checked() {
        let mut m = ClusterMap::new("c1", 64, 32, 3, 6);
        for i in 1..=6 {
            m.apply(&MapCommand::Register(node(i))).expect("register");
        }
        assert_eq!(m.epoch, Epoch(6));
        assert_eq!(m.apply(&MapCommand::Register(node(3))).expect("same again"), Epoch(6));
        let down = MapCommand::SetState {
            id: NodeId(2),
            state: NodeState::Down,
        };
        assert_eq!(m.apply(&down).expect("down"), Epoch(7));
        assert_eq!(m.apply(&down).expect("down again"), Epoch(7));
        assert_eq!(
            m.apply(&MapCommand::Remove { id: NodeId(2) }),
            Err(MapError::NotOut(NodeId(2)))
        );
        assert_eq!(
            m.apply(&MapCommand::SetState {
                id: NodeId(9),
                state: NodeState::Up
            }),
            Err(MapError::UnknownNode(NodeId(9)))
        );
        let mut clash = node(7);
        clash.addr = node(1).addr;
        assert!(matches!(
            m.apply(&MapCommand::Register(clash)),
            Err(MapError::AddressInUse { .. })
        ));
        let json = serde_json::to_string(&m).expect("serialise");
        assert_eq!(serde_json::from_str::<ClusterMap>(&json).expect("parse"), m);
    }

    #[test]
    fn down_nodes_keep_their_place_and_out_nodes_lose_it() {
        let mut m = formed(128, 8);
        let p0 = m.placement();
        m.apply(&MapCommand::SetState {
            id: NodeId(4),
            state: NodeState::Down,
        })
        .expect("down");
        assert_eq!(m.placement().partition(PartitionId(5)), p0.partition(PartitionId(5)));
        m.apply(&MapCommand::SetState {
            id: NodeId(4),
            state: NodeState::Out,
        })
        .expect("out");
        let p2 = m.placement();
        assert!(p2.partitions_of(NodeId(4)).is_empty());
        assert!((0..64).all(|g| p2.pg(PgId(g)).len() == 6 && !p2.pg(PgId(g)).contains(&NodeId(4))));
        assert!((0..128).all(|p| p2.partition(PartitionId(p)).len() == 3));
    }

    #[test]
    fn a_moved_partition_keeps_its_holders_until_its_move_is_done() {
        let mut m = formed(64, 6);
        let p0 = m.placement();
        m.apply(&MapCommand::Register(node(7))).expect("join");
        let p1 = m.placement();
        assert!(!m.moves.is_empty(), "a join moves some partitions");
        for p in 0..64 {
            let (was, is) = (p0.partition(PartitionId(p)), p1.partition(PartitionId(p)));
            assert_eq!(&is[..was.len()], was, "partition {p}: its holders stay first");
            match m.moves.get(&PartitionId(p)) {
                Some(mv) => {
                    assert_eq!(mv.holders, was);
                    assert_eq!(is.len(), 4);
                    assert_eq!(is[3], NodeId(7));
                }
                None => assert_eq!(is.len(), 3),
            }
        }
        let (&p, mv) = m.moves.iter().next().expect("one moves");
        let checked = mv.since;
        // A replica that changes state after the check keeps the move.
        let holder = mv.holders[0];
        m.apply(&MapCommand::SetState {
            id: holder,
            state: NodeState::Down,
        })
        .expect("down");
        let e = m.epoch;
        assert_eq!(
            m.apply(&MapCommand::MoveDone {
                partitions: vec![p],
                checked_in: checked
            })
            .expect("refused quietly"),
            e
        );
        assert!(m.moves.contains_key(&p));
        let e = m
            .apply(&MapCommand::MoveDone {
                partitions: vec![p],
                checked_in: e,
            })
            .expect("done");
        assert!(!m.moves.contains_key(&p));
        assert_eq!(m.placement().partition(p).len(), 3);
        assert!(!m.placement().partition(p).contains(&holder) || m.wanted(&m.meta_candidates(), p.0).contains(&holder));
        assert_eq!(m.epoch, e);
        // Maps travel as JSON, with or without moves.
        let json = serde_json::to_string(&m).expect("serialise");
        assert_eq!(serde_json::from_str::<ClusterMap>(&json).expect("parse"), m);
        let mut still = m.clone();
        still.moves.clear();
        let plain = serde_json::to_string(&still).expect("serialise");
        assert!(!plain.contains("moves"), "an older reader sees the same shape");
    }

    #[test]
    fn holders_that_leave_are_not_waited_for() {
        let mut m = formed(64, 6);
        m.apply(&MapCommand::Register(node(7))).expect("join");
        let moving = m.moves.len();
        assert!(moving > 0);
        // Node 7 leaves for good before any move finished: the partitions are back
        // where they were, nothing moves.
        m.apply(&MapCommand::SetState {
            id: NodeId(7),
            state: NodeState::Out,
        })
        .expect("out");
        assert!(m.moves.is_empty(), "{:?}", m.moves);
        // A holder going Out: its partitions get a new replica without a move, the
        // others it held still being replicas.
        m.apply(&MapCommand::SetState {
            id: NodeId(2),
            state: NodeState::Out,
        })
        .expect("out");
        assert!(m.moves.values().all(|mv| !mv.holders.contains(&NodeId(2))));
        assert!((0..64).all(|p| !m.placement().partition(PartitionId(p)).contains(&NodeId(2))));
    }

    fn at(epoch: u64) -> std::sync::Arc<ClusterMap> {
        let mut m = ClusterMap::new("c", 4, 4, 3, 6);
        m.epoch = Epoch(epoch);
        std::sync::Arc::new(m)
    }

    #[test]
    fn nodes_back_up_are_named_once() {
        let mut m = ClusterMap::new("c", 4, 4, 3, 6);
        for id in 1..=3u64 {
            m.apply(&MapCommand::Register(NodeInfo {
                id: NodeId(id),
                addr: SocketAddr::from(([127, 0, 0, 1], 7000 + id as u16)),
                roles: Roles {
                    manager: false,
                    meta: true,
                    data: true,
                },
                domain: format!("h{id}"),
                state: NodeState::Up,
            }))
            .expect("register");
        }
        let empty = ClusterMap::new("c", 4, 4, 3, 6);
        assert_eq!(m.returned_since(&empty).len(), 3, "new nodes count as back");
        assert!(m.returned_since(&m).is_empty());
        let mut down = m.clone();
        down.apply(&MapCommand::SetState {
            id: NodeId(2),
            state: NodeState::Down,
        })
        .expect("down");
        assert!(down.returned_since(&m).is_empty());
        assert_eq!(m.returned_since(&down), vec![SocketAddr::from(([127, 0, 0, 1], 7002))]);
    }

    #[test]
    fn a_history_hands_out_only_complete_chains() {
        let mut h = MapHistory::default();
        for e in [3, 4, 5, 7, 8] {
            h.record(at(e));
        }
        let epochs =
            |c: Option<Vec<std::sync::Arc<ClusterMap>>>| c.map(|v| v.iter().map(|m| m.epoch.0).collect::<Vec<_>>());
        assert_eq!(epochs(h.chain(Epoch(3), Epoch(5))), Some(vec![3, 4, 5]));
        assert_eq!(epochs(h.chain(Epoch(4), Epoch(4))), Some(vec![4]));
        assert_eq!(epochs(h.chain(Epoch(6), Epoch(5))), Some(vec![]));
        assert_eq!(epochs(h.chain(Epoch(5), Epoch(7))), None, "6 is missing");
        assert_eq!(epochs(h.chain(Epoch(7), Epoch(9))), None, "9 is not known yet");
        assert_eq!(epochs(h.chain(Epoch(2), Epoch(3))), None, "2 is not held");
        // An older map (a manager restored from an older snapshot) replaces what follows.
        h.record(at(4));
        assert_eq!(epochs(h.chain(Epoch(3), Epoch(4))), Some(vec![3, 4]));
        assert_eq!(epochs(h.chain(Epoch(4), Epoch(5))), None);
        // Bounded.
        for e in 10..10 + HISTORY_MAPS as u64 + 5 {
            h.record(at(e));
        }
        assert_eq!(h.chain(Epoch(10), Epoch(11)), None);
        let last = 10 + HISTORY_MAPS as u64 + 4;
        assert_eq!(
            epochs(h.chain(Epoch(last - 1), Epoch(last))),
            Some(vec![last - 1, last])
        );
    }

    #[test]
    fn client_grants_take_new_serials_and_revoked_ones_stay_dead() {
        let mut m = ClusterMap::new("c", 8, 8, 3, 6);
        let grant = |write| MapCommand::GrantClient {
            name: "gpu-1".into(),
            write,
            root_squash: true,
            act_as: None,
            subtree: (!write).then(|| Subtree {
                root: crate::ids::Ino(7),
                path: "/data".into(),
            }),
        };
        let e1 = m.apply(&grant(true)).expect("grant");
        assert_eq!(m.client("gpu-1", 1).map(|g| g.write), Some(true));
        m.apply(&grant(false)).expect("grant again");
        assert!(m.client("gpu-1", 1).is_none(), "the first key is dead");
        assert_eq!(
            m.client("gpu-1", 2)
                .map(|g| (g.write, g.root_squash, g.subtree.as_ref().map(|s| s.root))),
            Some((false, true, Some(crate::ids::Ino(7))))
        );
        let revoke = MapCommand::RevokeClient { name: "gpu-1".into() };
        let e3 = m.apply(&revoke).expect("revoke");
        assert!(e3 > e1 && m.client("gpu-1", 2).is_none());
        assert_eq!(m.apply(&revoke).expect("again"), e3, "revoking twice changes nothing");
        m.apply(&grant(true)).expect("granted anew");
        assert!(m.client("gpu-1", 2).is_none() && m.client("gpu-1", 3).is_some());
        assert_eq!(
            m.apply(&MapCommand::RevokeClient { name: "never".into() }),
            Err(MapError::UnknownClient("never".into()))
        );
        let bad = MapCommand::GrantClient {
            name: "a/b".into(),
            write: true,
            root_squash: false,
            act_as: None,
            subtree: None,
        };
        assert_eq!(m.apply(&bad), Err(MapError::BadClientName("a/b".into())));
        let json = serde_json::to_string(&m).expect("json");
        assert_eq!(serde_json::from_str::<ClusterMap>(&json).expect("back"), m);
    }

    #[test]
    fn grants_squash_root_or_everyone() {
        use crate::namespace::Creds;
        let g = |root_squash, act_as| ClientGrant {
            serial: 1,
            revoked: false,
            write: true,
            root_squash,
            act_as,
            subtree: None,
        };
        let user = Creds {
            uid: 1000,
            gid: 1000,
            groups: vec![4, 27],
        };
        let nobody = Creds {
            uid: SQUASHED_ID,
            gid: SQUASHED_ID,
            groups: vec![],
        };
        let after = |grant: ClientGrant, mut c: Creds| {
            grant.squash(&mut c);
            c
        };
        assert_eq!(after(g(true, None), Creds::root()), nobody);
        assert_eq!(after(g(true, None), user.clone()), user, "only root is squashed");
        assert_eq!(after(g(false, None), Creds::root()), Creds::root());
        let tenant = Creds {
            uid: 2000,
            gid: 3000,
            groups: vec![],
        };
        for c in [Creds::root(), user.clone()] {
            assert_eq!(after(g(false, Some((2000, 3000))), c), tenant);
        }
        // A grant written before `act_as` existed reads back without it.
        let old = r#"{"serial":1,"revoked":false,"write":true,"root_squash":true}"#;
        assert_eq!(
            serde_json::from_str::<ClientGrant>(old).expect("old grant"),
            g(true, None)
        );
    }
}
