//! Copies that may still serve reads without receiving a partition's batches (pure).
//!
//! Reads are served by any caught-up copy, whatever the caller's epoch. A copy learns
//! that it stopped being a member only when its node adopts the map that says so; until
//! then it goes on serving what it holds. When a map drops a holder from a partition (a
//! move finished, a placement changed) its primary stops replicating to it at once, so a
//! client whose map is also behind could read from that copy and miss a write
//! acknowledged since — a close-to-open violation (found in `shingle/tests/file_data.rs`,
//! put back as [`crate::sim::Bug::AckPastDroppedHolder`]).
//!
//! The rule: a primary acknowledges a batch in epoch `E` only once every Up node that
//! may still serve a copy of the partition without being one of `E`'s members has said
//! it adopted a map in which it is not a member (which stops its copy). [`ReadFence`]
//! tracks which nodes those are, from each map change a node adopts:
//! - across consecutive epochs, the members the new map dropped (Up in it: a Down node
//!   lost touch with the managers before it was marked Down and stopped serving then);
//! - after a gap (a restart, epochs skipped), every Up metadata node that is not a
//!   member: the node cannot tell who held copies in between.
//!
//! A node confirms an epoch once for all partitions (one call per node and epoch,
//! [`ReadFence::confirm`]); an entry is dropped once its node confirmed, became a member
//! again (it then receives every batch) or left the Up set.
//!
//! What members know travels so that a gap is rarely paid for: a member that applies a
//! batch its primary led in epoch `e` forgets what it knew up to `e`
//! ([`ReadFence::batch_applied`]: the primary heard from all of them first), and a new
//! primary's takeover asks every member anyway, whose answers carry what each knows of
//! the partition ([`Knowledge`]); one that knows it without a gap since the new primary's
//! own replaces the "every node" rule with its list ([`ReadFence::absorb`]).
//!
//! No I/O and no clock: the metadata service and the simulator run the same code.

use crate::ids::{Epoch, NodeId, PartitionId};
use crate::map::MapView;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What a member knows of the nodes that may serve a partition it holds without being
/// members, in its answer to a new primary ([`super::wire::Pulled`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Knowledge {
    /// The member's map epoch when it answered.
    pub at: Epoch,
    /// It knows every such node (no gap since the last batch it applied): `dropped` is
    /// the whole list.
    pub complete: bool,
    /// Dropped nodes not heard from since, with the epoch each must confirm.
    pub dropped: Vec<(NodeId, Epoch)>,
}

/// Per partition, the nodes whose copies may serve reads without following the
/// primary, and what each node confirmed.
#[derive(Clone, Debug, Default)]
pub struct ReadFence {
    /// Partition → node → the epoch it must confirm (the one that dropped it).
    dropped: BTreeMap<PartitionId, BTreeMap<NodeId, Epoch>>,
    /// Partitions learnt across a gap: every Up metadata node that is not a member must
    /// confirm this epoch.
    everyone: BTreeMap<PartitionId, Epoch>,
    /// The newest epoch each node said it adopted.
    confirmed: BTreeMap<NodeId, Epoch>,
}

impl ReadFence {
    /// Takes a map change this node (`me`) adopts. `consecutive` as in
    /// [`super::protocol::adopt_copy`]: `new` directly follows `old` and the node stayed
    /// in touch.
    pub fn adopt(&mut self, old: &MapView, new: &MapView, consecutive: bool, me: NodeId) {
        if !consecutive || old.map.epoch.0 == 0 {
            self.after_gap(new);
        } else {
            for p in (0..new.map.partitions).map(PartitionId) {
                let is = new.members(p);
                for n in old.members(p) {
                    if n != me && !is.contains(&n) && new.map.is_up(n) {
                        self.dropped.entry(p).or_default().insert(n, new.map.epoch);
                    }
                }
            }
        }
        // Members again receive every batch; nodes no longer Up stopped serving when
        // they lost touch.
        self.dropped.retain(|p, nodes| {
            let members = new.members(*p);
            nodes.retain(|n, _| !members.contains(n) && new.map.is_up(*n));
            !nodes.is_empty()
        });
        self.confirmed.retain(|n, _| new.map.nodes.contains_key(n));
    }

    /// Takes a map learnt without the ones before it (a start, a restart, skipped
    /// epochs): every Up metadata node that is not a member may hold a copy.
    pub fn after_gap(&mut self, new: &MapView) {
        self.dropped.clear();
        self.everyone = (0..new.map.partitions)
            .map(|p| (PartitionId(p), new.map.epoch))
            .collect();
    }

    /// Records that node `n` adopted `epoch` (or a newer one).
    pub fn confirm(&mut self, n: NodeId, epoch: Epoch) {
        let e = self.confirmed.entry(n).or_insert(epoch);
        *e = (*e).max(epoch);
    }

    /// The nodes `me`, as primary of `p` in `v`, must hear from before acknowledging a
    /// batch, with the epoch each must confirm; entries already confirmed are dropped.
    /// Empty when the partition may acknowledge.
    pub fn needed(&mut self, p: PartitionId, v: &MapView, me: NodeId) -> Vec<(NodeId, Epoch)> {
        let members = v.members(p);
        let confirmed = &self.confirmed;
        let done = |n: &NodeId, e: &Epoch| confirmed.get(n).is_some_and(|c| c >= e);
        let mut out = Vec::new();
        if let Some(nodes) = self.dropped.get_mut(&p) {
            nodes.retain(|n, e| !done(n, e) && !members.contains(n) && v.map.is_up(*n));
            out.extend(nodes.iter().map(|(n, e)| (*n, *e)));
            if nodes.is_empty() {
                self.dropped.remove(&p);
            }
        }
        if let Some(e) = self.everyone.get(&p).copied() {
            let waiting: Vec<NodeId> = v
                .map
                .nodes
                .values()
                .filter(|i| i.id != me && i.roles.meta && v.map.is_up(i.id) && !members.contains(&i.id))
                .filter(|i| !done(&i.id, &e))
                .map(|i| i.id)
                .collect();
            if waiting.is_empty() {
                self.everyone.remove(&p);
            }
            for n in waiting {
                match out.iter_mut().find(|(m, _)| *m == n) {
                    Some(at) => at.1 = at.1.max(e),
                    None => out.push((n, e)),
                }
            }
        }
        out
    }

    /// What this node, at map epoch `at`, knows of `p` (see [`Knowledge`]).
    pub fn knowledge(&self, p: PartitionId, at: Epoch) -> Knowledge {
        Knowledge {
            at,
            complete: !self.everyone.contains_key(&p),
            dropped: self
                .dropped
                .get(&p)
                .map(|d| d.iter().map(|(n, e)| (*n, *e)).collect())
                .unwrap_or_default(),
        }
    }

    /// This node, as a member, applied a batch of `p` its primary led in `epoch`: the
    /// primary had heard from every node fenced then, so what was known up to `epoch` is
    /// settled.
    pub fn batch_applied(&mut self, p: PartitionId, epoch: Epoch) {
        if self.everyone.get(&p).is_some_and(|e| *e <= epoch) {
            self.everyone.remove(&p);
        }
        if let Some(d) = self.dropped.get_mut(&p) {
            d.retain(|_, e| *e > epoch);
            if d.is_empty() {
                self.dropped.remove(&p);
            }
        }
    }

    /// Takes a member's answer for `p` (a takeover asks every member). Its dropped nodes
    /// join this node's; a complete answer from an epoch not older than this node's last
    /// gap lifts the "every node" rule: the member tracked every drop up to its epoch,
    /// and this node every one since its gap.
    pub fn absorb(&mut self, p: PartitionId, k: &Knowledge) {
        for (n, e) in &k.dropped {
            let at = self.dropped.entry(p).or_default().entry(*n).or_insert(*e);
            *at = (*at).max(*e);
        }
        if k.complete && self.everyone.get(&p).is_some_and(|g| *g <= k.at) {
            self.everyone.remove(&p);
        }
    }

    /// Whether anything is fenced (for tests and status).
    pub fn is_empty(&self) -> bool {
        self.dropped.is_empty() && self.everyone.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::map::{ClusterMap, NodeInfo, NodeState};

    fn map(epoch: u64, nodes: &[(u64, NodeState)]) -> MapView {
        let mut m = ClusterMap::new("t", 8, 1, 3, 1);
        for (id, state) in nodes {
            let id = NodeId(*id);
            let addr = std::net::SocketAddr::from(([127, 0, 0, 1], 7000 + id.0 as u16));
            m.nodes.insert(id, NodeInfo::meta_only(id, addr, *state));
        }
        m.epoch = Epoch(epoch);
        MapView::new(m)
    }

    fn up(ids: &[u64]) -> Vec<(u64, NodeState)> {
        ids.iter().map(|i| (*i, NodeState::Up)).collect()
    }

    /// A partition of `v` whose members differ from `old`'s, with the dropped nodes.
    fn moved(old: &MapView, new: &MapView) -> Option<(PartitionId, Vec<NodeId>)> {
        (0..new.map.partitions).map(PartitionId).find_map(|p| {
            let is = new.members(p);
            let gone: Vec<NodeId> = old.members(p).into_iter().filter(|n| !is.contains(n)).collect();
            (!gone.is_empty()).then_some((p, gone))
        })
    }

    #[test]
    fn a_dropped_holder_must_confirm_before_the_primary_acknowledges() {
        let old = map(5, &up(&[1, 2, 3]));
        let new = map(6, &up(&[1, 2, 3, 4]));
        let (p, gone) = moved(&old, &new).expect("a fourth node takes some partition");
        let me = new.primary(p).expect("a primary");
        let mut f = ReadFence::default();
        f.adopt(&old, &new, true, me);
        let need: Vec<NodeId> = f.needed(p, &new, me).into_iter().map(|(n, _)| n).collect();
        let want: Vec<NodeId> = gone.iter().copied().filter(|n| *n != me).collect();
        assert_eq!(need, want);
        // Confirming an older epoch is not enough; the epoch that dropped it is.
        for n in &want {
            f.confirm(*n, Epoch(5));
        }
        assert_eq!(f.needed(p, &new, me).len(), want.len());
        for n in &want {
            f.confirm(*n, Epoch(6));
        }
        assert!(f.needed(p, &new, me).is_empty());
        // Partitions whose members did not change need nobody.
        for q in (0..8).map(PartitionId) {
            if old.members(q) == new.members(q) {
                assert!(f.needed(q, &new, new.primary(q).expect("a primary")).is_empty());
            }
        }
    }

    #[test]
    fn entries_carry_across_epochs_until_confirmed_and_drop_when_down_or_member() {
        let old = map(5, &up(&[1, 2, 3]));
        let new = map(6, &up(&[1, 2, 3, 4]));
        let (p, gone) = moved(&old, &new).expect("moved");
        let me = new.primary(p).expect("a primary");
        let mut f = ReadFence::default();
        f.adopt(&old, &new, true, me);
        // An unrelated change: the entry stays.
        let mut later = new.map.clone();
        later.epoch = Epoch(7);
        let later = MapView::new(later);
        f.adopt(&new, &later, true, me);
        assert_eq!(f.needed(p, &later, me).len(), gone.iter().filter(|n| **n != me).count());
        // The dropped node goes Down: it stopped serving when it lost touch.
        let mut down = later.map.clone();
        down.epoch = Epoch(8);
        for n in &gone {
            down.nodes.get_mut(n).expect("in the map").state = NodeState::Down;
        }
        let down = MapView::new(down);
        f.adopt(&later, &down, true, me);
        assert!(f.needed(p, &down, me).is_empty());
    }

    #[test]
    fn after_a_gap_every_up_non_member_must_confirm() {
        let old = map(0, &[]);
        let new = map(9, &up(&[1, 2, 3, 4, 5]));
        let p = PartitionId(3);
        let me = new.primary(p).expect("a primary");
        let mut f = ReadFence::default();
        f.adopt(&old, &new, false, me);
        let members = new.members(p);
        let mut need: Vec<NodeId> = f.needed(p, &new, me).into_iter().map(|(n, _)| n).collect();
        need.sort();
        let want: Vec<NodeId> = (1..=5).map(NodeId).filter(|n| !members.contains(n)).collect();
        assert_eq!(need, want);
        for n in &want {
            f.confirm(*n, Epoch(9));
        }
        assert!(f.needed(p, &new, me).is_empty());
        // Confirmations are per node: once every other node confirmed, every partition
        // is clear at once.
        for n in (1..=5).map(NodeId).filter(|n| *n != me) {
            f.confirm(n, Epoch(9));
        }
        for q in (0..8).map(PartitionId) {
            assert!(f.needed(q, &new, me).is_empty(), "partition {}", q.0);
        }
        assert!(f.is_empty());
    }

    #[test]
    fn a_takeover_learns_from_a_member_without_a_gap() {
        let old = map(5, &up(&[1, 2, 3]));
        let new = map(6, &up(&[1, 2, 3, 4]));
        let (p, gone) = moved(&old, &new).expect("moved");
        let members = new.members(p);
        let (a, b) = (members[0], members[1]);
        // B has held the partition since before the move, and applied a batch in 5.
        let mut fb = ReadFence::default();
        fb.after_gap(&map(4, &up(&[1, 2, 3])));
        assert!(!fb.knowledge(p, Epoch(4)).complete);
        fb.batch_applied(p, Epoch(5));
        fb.adopt(&old, &new, true, b);
        // A restarted: it knows nothing of what happened before 6.
        let mut fa = ReadFence::default();
        fa.after_gap(&new);
        let everyone = fa.needed(p, &new, a).len();
        // An answer from before A's gap does not lift the rule...
        fa.absorb(p, &fb.knowledge(p, Epoch(5)));
        assert_eq!(fa.needed(p, &new, a).len(), everyone);
        // ...one from its epoch does: only the nodes the move dropped are left.
        fa.absorb(p, &fb.knowledge(p, Epoch(6)));
        let mut need: Vec<NodeId> = fa.needed(p, &new, a).into_iter().map(|(n, _)| n).collect();
        need.sort();
        let mut want: Vec<NodeId> = gone.into_iter().filter(|n| *n != a).collect();
        want.sort();
        assert_eq!(need, want);
        // A batch led in 6 settles what B knew up to 6.
        fb.batch_applied(p, Epoch(6));
        assert_eq!(
            fb.knowledge(p, Epoch(6)),
            Knowledge {
                at: Epoch(6),
                complete: true,
                dropped: Vec::new()
            }
        );
    }
}
