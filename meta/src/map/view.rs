//! What holders of the map keep and route by: [`MapView`] (a map with its derived
//! placement: members, primaries, addresses) and [`MapHistory`] (the recent maps in
//! epoch order, so several changes learnt at once are taken one by one).

use super::{ClusterMap, Placement};
use crate::ids::{Epoch, NodeId, PartitionId};
use std::net::SocketAddr;

/// A map and the placement derived from it: what the metadata service and its
/// clients route by (members of a partition, its primary, node addresses).
pub struct MapView {
    /// The map.
    pub map: ClusterMap,
    /// Its placement.
    pub placement: Placement,
}

impl MapView {
    /// Derives the placement.
    pub fn new(map: ClusterMap) -> Self {
        let placement = map.placement();
        MapView { map, placement }
    }

    /// Up replicas of `p`, primary first.
    pub fn members(&self, p: PartitionId) -> Vec<NodeId> {
        self.placement
            .partition(p)
            .iter()
            .copied()
            .filter(|n| self.map.is_up(*n))
            .collect()
    }

    /// The primary of `p`.
    pub fn primary(&self, p: PartitionId) -> Option<NodeId> {
        self.members(p).first().copied()
    }

    /// A node's address.
    pub fn addr(&self, n: NodeId) -> Option<SocketAddr> {
        self.map.addr(n)
    }
}

/// How many recent maps a [`MapHistory`] keeps.
pub const HISTORY_MAPS: usize = 32;

/// The most recent maps, epoch by epoch, so a holder that learns of several changes at
/// once can take them in order: a meta node that adopts every epoch in turn knows
/// which of its copies stayed members throughout and keeps those serving, where one
/// that skipped an epoch must assume it missed writes and stop them all (decision
/// 0008). Managers keep the maps they applied; agents keep those they fetched.
#[derive(Clone, Debug, Default)]
pub struct MapHistory {
    maps: std::collections::VecDeque<std::sync::Arc<ClusterMap>>,
}

impl MapHistory {
    /// Records `map`. A map not newer than the last recorded replaces what follows it
    /// (a manager that installed an older snapshot); a gap is kept (the chain across
    /// it is refused).
    pub fn record(&mut self, map: std::sync::Arc<ClusterMap>) {
        while self.maps.back().is_some_and(|m| m.epoch >= map.epoch) {
            self.maps.pop_back();
        }
        self.maps.push_back(map);
        while self.maps.len() > HISTORY_MAPS {
            self.maps.pop_front();
        }
    }

    /// The maps of every epoch in `from..=to`, in order, or `None` when any is missing.
    pub fn chain(&self, from: Epoch, to: Epoch) -> Option<Vec<std::sync::Arc<ClusterMap>>> {
        if from > to {
            return Some(Vec::new());
        }
        let first = self.maps.iter().position(|m| m.epoch == from)?;
        let want = usize::try_from(to.0 - from.0).ok()?.checked_add(1)?;
        let out: Vec<_> = self.maps.iter().skip(first).take(want).cloned().collect();
        let contiguous = out.len() == want && out.iter().zip(from.0..).all(|(m, e)| m.epoch.0 == e);
        contiguous.then_some(out)
    }
}
