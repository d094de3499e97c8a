//! Placement: which nodes hold a metadata partition or a data placement group.
//!
//! Rendezvous (highest-random-weight) hashing: every candidate node gets a score from a
//! stable hash of (kind, group, node); a group's replicas are the best-scoring nodes,
//! taken greedily so that replicas land in distinct failure domains while there are
//! enough domains, then filled by score. A node joining or leaving changes a group
//! only when it is (or was) among the group's best scores, so about R/N of the groups
//! change one replica each: ~1/N of all replicas move, the minimum.
//!
//! Pure functions over the cluster map: no sockets, no clocks.

use crate::ids::{Ino, NodeId, PartitionId, PgId};
use std::collections::HashSet;

/// A candidate node: its id and failure domain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate<'a> {
    /// The node.
    pub id: NodeId,
    /// Failure domain (rack, host, ...): replicas avoid sharing one.
    pub domain: &'a str,
}

fn mix(mut x: u64) -> u64 {
    // splitmix64 finaliser: a fixed, well-distributed, version-stable mix.
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The rendezvous score of `node` for group `group` of kind `kind`.
pub fn score(kind: u64, group: u64, node: NodeId) -> u64 {
    mix(mix(mix(kind) ^ group) ^ node.0)
}

/// Kind salt for metadata partitions.
pub const KIND_PARTITION: u64 = 1;
/// Kind salt for data placement groups.
pub const KIND_PG: u64 = 2;

/// The ordered replica list of one group: `count` distinct nodes, spread over distinct
/// failure domains while possible, best score first.
pub fn place(kind: u64, group: u64, candidates: &[Candidate<'_>], count: usize) -> Vec<NodeId> {
    let mut scored: Vec<(u64, &Candidate<'_>)> = candidates.iter().map(|c| (score(kind, group, c.id), c)).collect();
    scored.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.id.cmp(&b.1.id)));
    let mut chosen: Vec<NodeId> = Vec::with_capacity(count);
    let mut domains: HashSet<&str> = HashSet::new();
    for (_, c) in &scored {
        if chosen.len() == count {
            break;
        }
        if domains.insert(c.domain) {
            chosen.push(c.id);
        }
    }
    for (_, c) in &scored {
        if chosen.len() == count {
            break;
        }
        if !chosen.contains(&c.id) {
            chosen.push(c.id);
        }
    }
    chosen
}

/// The metadata partition of a directory entry: hash of (parent, name) modulo the
/// partition count. Stable across versions and machines.
pub fn dentry_partition(parent: Ino, name: &[u8], partitions: u32) -> PartitionId {
    // FNV-1a over the name, mixed with the parent.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let x = mix(h ^ mix(parent.0));
    PartitionId((x % u64::from(partitions.max(1))) as u32)
}

/// The placement group of a stripe: hash of (inode, stripe) modulo the group count.
pub fn stripe_pg(ino: Ino, stripe: u64, pgs: u32) -> PgId {
    PgId((mix(mix(ino.0) ^ stripe) % u64::from(pgs.max(1))) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn nodes(n: u64, domains: u64) -> Vec<(NodeId, String)> {
        (1..=n).map(|i| (NodeId(i), format!("rack{}", i % domains))).collect()
    }

    fn cands(v: &[(NodeId, String)]) -> Vec<Candidate<'_>> {
        v.iter()
            .map(|(id, d)| Candidate {
                id: *id,
                domain: d.as_str(),
            })
            .collect()
    }

    /// The hashes that decide where every entry, inode and stripe of a cluster lives,
    /// pinned to literal values: a change to any of them would move everything an
    /// existing cluster stores (and a mixed-version cluster would look in the wrong
    /// places), so it must fail here first.
    #[test]
    fn placement_hashes_are_pinned() {
        // splitmix64's first output for seed 0, as published with the algorithm.
        assert_eq!(mix(0), 0xe220_a839_7b1d_cdaf);
        assert_eq!(score(KIND_PARTITION, 5, NodeId(3)), 0x0d68_0afa_1ba8_31b7);
        assert_eq!(dentry_partition(Ino::ROOT, b"data", 1024), PartitionId(621));
        let ino = Ino(0x0001_0000_0000_002a);
        assert_eq!(dentry_partition(ino, b"shard-000017.bin", 4096), PartitionId(805));
        assert_eq!(stripe_pg(ino, 7, 256), PgId(160));
    }

    #[test]
    fn dentry_partition_is_spread() {
        let mut counts = vec![0u32; 64];
        for i in 0..64_000u32 {
            counts[dentry_partition(Ino(7), format!("shard-{i:06}.bin").as_bytes(), 64).0 as usize] += 1;
        }
        let (min, max) = (
            counts.iter().min().copied().unwrap_or(0),
            counts.iter().max().copied().unwrap_or(0),
        );
        assert!(min > 850 && max < 1150, "uneven spread: {min}..{max}");
    }

    proptest! {
        #[test]
        fn replicas_are_distinct_and_use_distinct_domains_when_possible(
            n in 1u64..40, domains in 1u64..10, r in 1usize..6, group in any::<u64>(),
        ) {
            let v = nodes(n, domains);
            let c = cands(&v);
            let p = place(KIND_PARTITION, group, &c, r);
            prop_assert_eq!(p.len(), r.min(n as usize));
            let set: HashSet<_> = p.iter().collect();
            prop_assert_eq!(set.len(), p.len());
            let doms: HashSet<_> = p.iter().map(|id| v.iter().find(|(i, _)| i == id).map(|(_, d)| d.clone())).collect();
            let distinct_domains = v.iter().map(|(_, d)| d).collect::<HashSet<_>>().len();
            prop_assert_eq!(doms.len(), p.len().min(distinct_domains));
            prop_assert_eq!(p.clone(), place(KIND_PARTITION, group, &c, r), "placement is deterministic");
        }

        #[test]
        fn a_join_moves_about_one_nth_of_replicas(n in 4u64..30, r in 1usize..4) {
            let groups = 1024u64;
            let before_nodes = nodes(n, n);
            let mut after_nodes = before_nodes.clone();
            after_nodes.push((NodeId(1000), "new-rack".into()));
            let (b, a) = (cands(&before_nodes), cands(&after_nodes));
            let mut moved = 0usize;
            for g in 0..groups {
                let before: HashSet<_> = place(KIND_PARTITION, g, &b, r).into_iter().collect();
                let after: HashSet<_> = place(KIND_PARTITION, g, &a, r).into_iter().collect();
                moved += before.difference(&after).count();
                // Only the new node may appear; nothing shuffles between old nodes.
                prop_assert!(after.difference(&before).all(|id| *id == NodeId(1000)));
            }
            let total = groups as usize * r;
            let ideal = total as f64 / (n + 1) as f64;
            prop_assert!((moved as f64) < ideal * 1.4 + 10.0, "moved {moved} of {total}, ideal {ideal:.0}");
        }

        #[test]
        fn a_leave_moves_only_the_leavers_replicas(n in 4u64..30, r in 1usize..4, leaver in 1u64..4) {
            let before_nodes = nodes(n, n);
            let after_nodes: Vec<_> = before_nodes.iter().filter(|(id, _)| id.0 != leaver).cloned().collect();
            let (b, a) = (cands(&before_nodes), cands(&after_nodes));
            for g in 0..256u64 {
                let before = place(KIND_PG, g, &b, r);
                let after = place(KIND_PG, g, &a, r);
                let kept: Vec<_> = before.iter().filter(|id| id.0 != leaver).copied().collect();
                prop_assert!(kept.iter().all(|id| after.contains(id)), "a surviving replica moved");
            }
        }
    }
}
