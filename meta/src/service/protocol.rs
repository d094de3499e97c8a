//! The replication protocol of a partition copy, as pure decisions.
//!
//! What a copy does when its node adopts a new map, when its primary sends a batch,
//! when a whole copy is installed, and how a new primary decides from its members'
//! answers which copy to take and which reign to start. No I/O and no clock:
//! [`node`](super::node) runs these between network calls and disk writes, and the
//! simulator ([`crate::sim`]) runs the very same functions over hundreds of simulated
//! nodes with a faulty network and crashing disks.
//!
//! The rules (decision 0008):
//! - a batch is acknowledged once every member of the primary's map epoch made it
//!   durable; members are the partition's placement nodes that are Up, so while
//!   nodes are Down fewer copies hold the newest batches — a new primary that finds no
//!   complete copy must hear from every placement node, Down ones included (it waits
//!   for them), or it could start from a copy that missed batches acknowledged while
//!   it was away (found by the simulator: seed 4 of `meta/tests/sim.rs`);
//! - a copy serves only while it follows its primary's stream in order, was installed
//!   by it, or (as primary) began a reign of its own after taking the best copy;
//! - reigns are unique per partition ([`next_reign`]), so two primaries never number
//!   different batches alike.
//!
//! Invariants are asserted in release builds: a broken one means the copy would go on
//! serving wrong data, and stopping the process is the safe answer.

use super::copy::CopyId;
use super::replica::{Key, PartMeta, Replica, next_reign};
use super::wire::{PartOp, Pulled};
use crate::ids::{Epoch, NodeId};
use crate::namespace::Partition;

/// Whether a serving copy keeps serving when its node adopts a new map.
///
/// Only a copy that was a member before and is one after, across *consecutive* epochs
/// (a node that skipped one cannot know what it missed) with healthy contact to the
/// managers, keeps serving — and not when it was just promoted to primary: it must start
/// a reign of its own first (continuing its old primary's numbering could give two
/// different batches the same (reign, lsn), since the old primary may have persisted one
/// it never got acknowledged, and a later takeover would keep the wrong one).
pub fn keeps_serving(was_member: bool, is_member: bool, consecutive: bool, promoted: bool) -> bool {
    was_member && is_member && consecutive && !promoted
}

/// Applies a map change to a copy (see [`keeps_serving`]): a copy that stops serving
/// only because it was promoted is remembered as complete in `epoch`
/// ([`Replica::complete_at`]), so its takeover can begin at once.
pub fn adopt_copy(
    r: &mut Replica,
    epoch: Epoch,
    was_member: bool,
    is_member: bool,
    consecutive: bool,
    promoted: bool,
) -> bool {
    let stays = keeps_serving(was_member, is_member, consecutive, false);
    if !r.serving {
        // Still complete one epoch later, if nothing could have happened without it.
        r.complete_at = r
            .complete_at
            .filter(|e| stays && e.0.checked_add(1) == Some(epoch.0))
            .map(|_| epoch);
        return false;
    }
    if keeps_serving(was_member, is_member, consecutive, promoted) {
        return false;
    }
    r.serving = false;
    r.complete_at = stays.then_some(epoch);
    true
}

/// What a replica does with a batch of its primary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Follow {
    /// Already applied (a resend): acknowledge.
    Already,
    /// Missed batches or follows another reign: the primary must install its copy.
    NeedInstall,
    /// Applied in memory: persist these keys, then acknowledge and serve.
    Applied(Vec<Key>),
}

impl Replica {
    /// As primary: applies a batch as the next of this reign. Returns the keys to persist
    /// and the batch's number.
    pub fn lead(&mut self, ops: &[PartOp]) -> (Vec<Key>, u64) {
        assert!(
            self.serving,
            "partition {}: a batch led by a copy that is not serving",
            self.part.id.0
        );
        let keys = self.apply(ops);
        self.meta.lsn = self
            .meta
            .lsn
            .checked_add(1)
            .expect("a reign's batch numbers do not wrap");
        (keys, self.meta.lsn)
    }

    /// As replica: takes batch `lsn` of reign `reign` if it is the next one.
    pub fn follow(&mut self, reign: Epoch, lsn: u64, ops: &[PartOp]) -> Follow {
        if self.meta.state_epoch == reign && lsn <= self.meta.lsn {
            return Follow::Already;
        }
        if self.meta.state_epoch != reign || self.meta.lsn.checked_add(1) != Some(lsn) {
            return Follow::NeedInstall;
        }
        let keys = self.apply(ops);
        self.meta.lsn = lsn;
        // A replica may become primary without a takeover (its copy stays complete): keep
        // its counter above everything the primary may have handed out.
        self.resume_counters();
        Follow::Applied(keys)
    }

    /// Replaces this copy with `part` at position `copy` (an install from the primary or
    /// a new primary's pull). The copy serves once this is durable.
    ///
    /// A copy behind this one is refused: reigns only grow and a primary's batch numbers
    /// only grow within its reign, so it can only be a late or repeated message (an
    /// install that arrived after the batches that followed it would roll them back —
    /// found by the simulator: seed 2887 of `meta/tests/sim.rs`).
    pub fn install(&mut self, copy: &CopyId, part: Partition) -> Result<(), String> {
        if (copy.state_epoch, copy.lsn) < (self.meta.state_epoch, self.meta.lsn) {
            return Err(format!(
                "partition {}: a copy at {:#x}/{} is behind this one at {:#x}/{}",
                self.part.id.0, copy.state_epoch.0, copy.lsn, self.meta.state_epoch.0, self.meta.lsn
            ));
        }
        assert_eq!(
            part.id, self.part.id,
            "a copy of partition {} installed for {}",
            part.id.0, self.part.id.0
        );
        self.part = part;
        self.meta = PartMeta {
            lsn: copy.lsn,
            state_epoch: copy.state_epoch,
            counter_hwm: copy.counter_hwm,
        };
        self.resume_counters();
        self.serving = false;
        self.counter_shared = 0;
        self.complete_at = None;
        Ok(())
    }

    /// As primary: a member may have missed the batch of map epoch `led_in` just led
    /// (its replication failed), and the map is now at `now`. The copy stops serving
    /// until a takeover has every member install it; it stays complete in `now` when
    /// that is still `led_in` — the primary of an epoch holds every batch acknowledged
    /// in it, so its takeover needs no other copy. Without that, when the member that
    /// took the first try of that takeover stopped serving for a map change, the
    /// partition waited for the dead member's return (5 s in a debug-build bench run).
    pub fn batch_missed_a_member(&mut self, led_in: Epoch, now: Epoch) {
        self.serving = false;
        self.complete_at = (led_in == now).then_some(now);
    }

    /// As primary: every member made this batch durable. Its counter marks are now on
    /// every copy a later primary can start from, so numbers below them can be handed
    /// out without a batch of their own.
    pub fn acknowledged(&mut self, ops: &[PartOp]) {
        for op in ops {
            if let PartOp::Counter(hwm) = op {
                self.counter_shared = self.counter_shared.max(*hwm);
            }
        }
    }

    /// This copy's position as a copy to send, `total` bytes long once encoded.
    pub fn copy_id(&self, total: u64) -> CopyId {
        CopyId {
            state_epoch: self.meta.state_epoch,
            lsn: self.meta.lsn,
            counter_hwm: self.meta.counter_hwm,
            total,
        }
    }

    /// This copy's position, as a new primary asks for it.
    /// This copy's position (its node adds what it knows of the partition's fence).
    pub fn position(&self) -> Pulled {
        Pulled {
            serving: self.serving,
            state_epoch: self.meta.state_epoch,
            lsn: self.meta.lsn,
            counter_hwm: self.meta.counter_hwm,
            fence: Default::default(),
        }
    }

    /// As a new primary holding the best copy: starts reign `reign` (the copy serves once
    /// this is durable). Counting resumes above everything the old primary could have
    /// handed out (its durable mark: this copy's in-memory counter is a replica's).
    ///
    /// The mark is not raised here: a raise persisted only on this node is unknown to a
    /// later primary that does not hear from it, which would hand out the same numbers
    /// again (found by the simulator: seed 163 of `meta/tests/sim.rs`). The first
    /// number of the reign raises it with a replicated batch instead.
    pub fn begin_reign(&mut self, reign: Epoch) {
        assert!(
            reign > self.meta.state_epoch,
            "partition {}: reign {:#x} does not follow {:#x}",
            self.part.id.0,
            reign.0,
            self.meta.state_epoch.0
        );
        self.resume_counters();
        self.meta.state_epoch = reign;
        self.meta.lsn = 0;
        self.meta.counter_hwm = self.meta.counter_hwm.max(self.part.next_counter());
        self.counter_shared = 0;
    }
}

/// What a new primary does once its members answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TakeoverPlan {
    /// The member whose copy is newer than ours: pull it first.
    pub pull: Option<NodeId>,
    /// The reign to begin afterwards.
    pub reign: Epoch,
}

/// A new primary's tally of its members' positions.
#[derive(Clone, Debug)]
pub struct Takeover {
    epoch: Epoch,
    mine: (Epoch, u64),
    others: usize,
    reached: usize,
    any_serving: bool,
    best: Option<(Epoch, u64, NodeId)>,
    reigns: Vec<Epoch>,
    /// Down placement nodes not asked yet.
    down: Vec<NodeId>,
}

impl Takeover {
    /// Starts a takeover in map epoch `epoch` by a copy at `mine`, with `others` other
    /// placement nodes of the partition (Up or Down) to hear from.
    pub fn new(epoch: Epoch, mine: &Replica, others: usize) -> Takeover {
        Takeover {
            epoch,
            mine: (mine.meta.state_epoch, mine.meta.lsn),
            others,
            reached: 0,
            // Our own copy followed its primary to the end of the last epoch.
            any_serving: mine.complete_at == Some(epoch),
            best: None,
            reigns: vec![mine.meta.state_epoch],
            down: Vec::new(),
        }
    }

    /// Starts the takeover of a partition by `me` in map epoch `epoch`, whose placement
    /// nodes are `placed` and the Up ones among them `members`: the tally, and the nodes
    /// to ask first — the other members, unless this copy is complete itself. The Down
    /// placement nodes come later ([`Takeover::next_asks`]).
    pub fn start(
        epoch: Epoch,
        mine: &Replica,
        me: NodeId,
        placed: &[NodeId],
        members: &[NodeId],
    ) -> (Takeover, Vec<NodeId>) {
        let others: Vec<NodeId> = placed.iter().copied().filter(|n| *n != me).collect();
        let mut t = Takeover::new(epoch, mine, others.len());
        t.down = others.into_iter().filter(|n| !members.contains(n)).collect();
        let first = if t.decide().is_ok() {
            Vec::new()
        } else {
            members.iter().copied().filter(|n| *n != me).collect()
        };
        (t, first)
    }

    /// Every node asked so far answered (or failed): the nodes to ask next, or none when
    /// it is time to decide. The Down placement nodes are asked, once, when no answer
    /// showed a complete copy: they may hold batches acknowledged while the others were
    /// Down (found by the simulator: seed 4 of `meta/tests/sim.rs`), and the tally
    /// waits for every placement node then.
    pub fn next_asks(&mut self) -> Vec<NodeId> {
        if self.decide().is_ok() {
            return Vec::new();
        }
        std::mem::take(&mut self.down)
    }

    /// The simulator's [`crate::sim::Bug::TakeoverWithoutAllMembers`]: decides from
    /// whoever answered, as the protocol must not.
    pub(crate) fn without_waiting_for_all(&mut self) {
        self.others = 0;
        self.down.clear();
    }

    /// Counts a member's answer. An impossible position (a reign of a later epoch, no
    /// room left) is refused: it could only come from a peer that lies.
    pub fn answer(&mut self, from: NodeId, pos: &Pulled) -> Result<(), String> {
        let id = CopyId {
            state_epoch: pos.state_epoch,
            lsn: pos.lsn,
            counter_hwm: pos.counter_hwm,
            total: 0,
        };
        id.check(self.epoch)?;
        self.reached += 1;
        self.any_serving |= pos.serving;
        self.reigns.push(pos.state_epoch);
        if self.best.is_none_or(|(e, l, _)| (pos.state_epoch, pos.lsn) > (e, l)) {
            self.best = Some((pos.state_epoch, pos.lsn, from));
        }
        Ok(())
    }

    /// Decides, or says why not yet. Every acknowledged batch is on every member of its
    /// epoch, and members are the Up placement nodes, so the best copy is known once a
    /// member that is complete in this epoch answered, or once every placement node did.
    pub fn decide(&self) -> Result<TakeoverPlan, String> {
        if !self.any_serving && self.reached < self.others {
            return Err(format!(
                "only {} of {} other placement nodes answered and none has a complete copy",
                self.reached, self.others
            ));
        }
        let pull = self.best.filter(|(e, l, _)| (*e, *l) > self.mine).map(|(_, _, n)| n);
        // A reign of its own, distinct from every earlier one (this node's included: it
        // may be taking over a second time in this epoch).
        let reign = next_reign(self.epoch, self.reigns.iter().copied())
            .ok_or("a member has a reign of a later epoch, or this epoch has no reign left")?;
        Ok(TakeoverPlan { pull, reign })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::PartitionId;
    use crate::namespace::{DentryVal, FileKind, Mutation};
    use crate::service::replica::COUNTER_BLOCK;

    fn replica() -> Replica {
        let mut r = Replica::initial(PartitionId(3), 8, 0);
        r.serving = true;
        r
    }

    fn put(name: &str) -> PartOp {
        PartOp::Apply {
            intent: 0,
            step: 0,
            m: Mutation::PutDentry {
                parent: crate::ids::Ino(1),
                name: name.as_bytes().to_vec(),
                val: DentryVal {
                    ino: crate::ids::Ino(7),
                    kind: FileKind::File,
                },
            },
        }
    }

    fn pos(serving: bool, reign: u64, lsn: u64) -> Pulled {
        Pulled {
            serving,
            state_epoch: Epoch(reign),
            lsn,
            counter_hwm: 0,
            fence: Default::default(),
        }
    }

    #[test]
    fn a_replica_follows_in_order_only() {
        let mut primary = replica();
        primary.begin_reign(Epoch(5 << 16));
        let mut follower = replica();
        follower.meta.state_epoch = Epoch(5 << 16);
        let (_, one) = primary.lead(&[put("a")]);
        let (_, two) = primary.lead(&[put("b")]);
        assert_eq!(follower.follow(Epoch(5 << 16), two, &[put("b")]), Follow::NeedInstall);
        assert!(matches!(
            follower.follow(Epoch(5 << 16), one, &[put("a")]),
            Follow::Applied(_)
        ));
        assert_eq!(follower.follow(Epoch(5 << 16), one, &[put("a")]), Follow::Already);
        assert!(matches!(
            follower.follow(Epoch(5 << 16), two, &[put("b")]),
            Follow::Applied(_)
        ));
        assert_eq!(follower.part, primary.part);
        assert_eq!(follower.follow(Epoch(6 << 16), 3, &[]), Follow::NeedInstall);
    }

    #[test]
    fn an_install_behind_the_copy_is_refused() {
        let mut r = replica();
        r.meta.state_epoch = Epoch(5 << 16);
        r.meta.lsn = 4;
        let part = r.part.clone();
        let copy = |reign: u64, lsn| CopyId {
            state_epoch: Epoch(reign),
            lsn,
            counter_hwm: 0,
            total: 0,
        };
        assert!(r.install(&copy(5 << 16, 3), part.clone()).is_err());
        assert!(r.install(&copy(4 << 16, 9), part.clone()).is_err());
        assert!(r.serving, "a refused install changes nothing");
        r.install(&copy(5 << 16, 4), part.clone()).expect("accepted");
        r.install(&copy(6 << 16, 0), part).expect("accepted");
        assert!(!r.serving);
        assert_eq!((r.meta.state_epoch, r.meta.lsn), (Epoch(6 << 16), 0));
    }

    #[test]
    fn a_takeover_waits_for_all_members_unless_one_was_complete() {
        let mine = replica();
        let mut t = Takeover::new(Epoch(9), &mine, 2);
        t.answer(NodeId(2), &pos(false, 8 << 16, 4)).expect("accepted");
        assert!(t.decide().is_err(), "one of two answered, neither complete");
        t.answer(NodeId(3), &pos(false, 8 << 16, 6)).expect("accepted");
        let plan = t.decide().expect("accepted");
        assert_eq!(plan.pull, Some(NodeId(3)));
        assert_eq!(plan.reign, Epoch(9 << 16));

        let mut t = Takeover::new(Epoch(9), &mine, 2);
        t.answer(NodeId(2), &pos(true, 8 << 16, 4)).expect("accepted");
        assert_eq!(t.decide().expect("decided").pull, Some(NodeId(2)));
    }

    #[test]
    fn down_placement_nodes_are_asked_once_when_no_member_is_complete() {
        let mine = replica();
        let (n1, n2, n3, n4) = (NodeId(1), NodeId(2), NodeId(3), NodeId(4));
        // Node 1 takes over; 2 is an Up member, 3 and 4 are Down.
        let (mut t, first) = Takeover::start(Epoch(9), &mine, n1, &[n1, n2, n3, n4], &[n1, n2]);
        assert_eq!(first, vec![n2]);
        t.answer(n2, &pos(false, 8 << 16, 4)).expect("accepted");
        assert_eq!(t.next_asks(), vec![n3, n4], "no complete member: ask the Down ones");
        t.answer(n3, &pos(false, 8 << 16, 6)).expect("accepted");
        assert!(t.next_asks().is_empty(), "asked once");
        assert!(t.decide().is_err(), "node 4 never answered");
        // A complete member: the Down ones are not asked.
        let (mut t, _) = Takeover::start(Epoch(9), &mine, n1, &[n1, n2, n3], &[n1, n2]);
        t.answer(n2, &pos(true, 8 << 16, 4)).expect("accepted");
        assert!(t.next_asks().is_empty());
        assert_eq!(t.decide().expect("decided").pull, Some(n2));
        // A copy complete itself asks nobody.
        let mut done = replica();
        done.serving = false;
        done.complete_at = Some(Epoch(9));
        let (mut t, first) = Takeover::start(Epoch(9), &done, n1, &[n1, n2, n3], &[n1, n2]);
        assert!(first.is_empty() && t.next_asks().is_empty());
    }

    #[test]
    fn a_second_takeover_in_an_epoch_gets_a_later_reign() {
        let mut mine = replica();
        mine.begin_reign(Epoch(9 << 16));
        let mut t = Takeover::new(Epoch(9), &mine, 1);
        t.answer(NodeId(2), &pos(false, 9 << 16, 0)).expect("accepted");
        let plan = t.decide().expect("accepted");
        assert_eq!(plan.pull, None);
        assert_eq!(plan.reign, Epoch((9 << 16) | 1));
        assert!(
            t.answer(NodeId(4), &pos(true, 10 << 16, 0)).is_err(),
            "a reign of a later epoch"
        );
    }

    #[test]
    fn a_new_reign_counts_above_every_mark_and_raises_it_with_a_batch() {
        let mut r = replica();
        r.part.set_next_counter(3000);
        r.meta.counter_hwm = 4000;
        r.begin_reign(Epoch(1 << 16));
        assert_eq!(r.meta.counter_hwm, 4000, "no raise that only this node would know");
        assert_eq!(r.meta.lsn, 0);
        assert_eq!(r.next_counter(), (4000, Some(4000 + COUNTER_BLOCK)));
    }

    #[test]
    #[should_panic(expected = "not serving")]
    fn a_copy_that_does_not_serve_cannot_lead() {
        let mut r = replica();
        r.serving = false;
        r.lead(&[put("a")]);
    }

    #[test]
    fn a_promoted_copy_that_followed_to_the_end_takes_over_at_once() {
        let mut r = replica();
        assert!(adopt_copy(&mut r, Epoch(7), true, true, true, true));
        assert_eq!(r.complete_at, Some(Epoch(7)));
        let t = Takeover::new(Epoch(7), &r, 2);
        assert_eq!(t.decide().expect("complete itself").pull, None);
        // Carried over consecutive epochs it stays a member in; lost on a skipped one.
        adopt_copy(&mut r, Epoch(8), true, true, true, false);
        assert_eq!(r.complete_at, Some(Epoch(8)));
        adopt_copy(&mut r, Epoch(10), true, true, false, false);
        assert_eq!(r.complete_at, None);
        assert!(Takeover::new(Epoch(10), &r, 2).decide().is_err());
        // A copy that stops for any other reason is not complete.
        let mut r = replica();
        assert!(adopt_copy(&mut r, Epoch(7), true, true, false, true));
        assert_eq!(r.complete_at, None);
    }

    #[test]
    fn only_members_across_consecutive_epochs_keep_serving() {
        assert!(keeps_serving(true, true, true, false));
        assert!(!keeps_serving(true, true, false, false));
        assert!(!keeps_serving(true, true, true, true));
        assert!(!keeps_serving(false, true, true, false));
        assert!(!keeps_serving(true, false, true, false));
    }
}
