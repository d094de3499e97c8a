//! The replication protocol under the deterministic simulator (`shingle_meta::sim`).
//!
//! A failure prints its seed and the `shingle sim ...` command that replays it.
//! The batch runs `SHINGLE_SIM_SEEDS` seeds (default 300) from `SHINGLE_SIM_SEED`
//! (default 1), and goes on for at least `SHINGLE_SIM_SECONDS` (default 0): a fixed
//! set of seeds in CI, so a run does not depend on the machine's speed.
//!
//! Namespace clients are left out of the batch (`ns_clients: 0`): with them the
//! simulator finds failures of the coordinator not fixed yet (decision 0009, "Known
//! gaps"; `shingle sim --seed 4 --nodes 7 --partitions 8 --ops 300 --clients 6
//! --ns-clients 3`).
//!
//! Nodes joining are left out of the batch (`joins: 0`): a join moves a partition's
//! copies, and a join with two failures can still lose acknowledged writes (decision
//! 0008, "Known gaps"; `shingle sim --seed 163 --nodes 8 --partitions 8 --joins 3`).

use shingle_meta::sim::{self, Bug, Config};
use std::time::{Duration, Instant};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A small world for seed `seed`: its size varies with the seed.
fn small(seed: u64) -> Config {
    Config {
        seed,
        nodes: 5 + (seed % 5) as u32,
        partitions: 4 << (seed % 3),
        ops: 300,
        clients: 6,
        ns_clients: 0,
        faults: true,
        max_down: 2,
        joins: 0,
        mass_failure_pct: 0,
        map_history: false,
        bug: None,
    }
}

#[test]
fn a_batch_of_seeds_keeps_every_invariant() {
    let first = env_u64("SHINGLE_SIM_SEED", 1);
    let count = env_u64("SHINGLE_SIM_SEEDS", 300);
    let budget = Duration::from_secs(env_u64("SHINGLE_SIM_SECONDS", 0));
    let start = Instant::now();
    let mut seed = first;
    let (mut acked, mut gave_up) = (0, 0);
    while seed < first + count || start.elapsed() < budget {
        match sim::run(&small(seed)) {
            Ok(r) => {
                acked += r.acked;
                gave_up += r.gave_up;
            }
            Err(f) => panic!("{f}"),
        }
        seed += 1;
    }
    eprintln!(
        "{} seeds ({first}..{seed}): {acked} operations acknowledged, {gave_up} given up",
        seed - first
    );
}

/// Runs seeds from 1 with `bug` put back until one fails; the seed that found it.
fn find(bug: Bug, seeds: u64) -> Option<(u64, String)> {
    (1..=seeds).find_map(|seed| {
        let cfg = Config {
            bug: Some(bug),
            ..small(seed)
        };
        sim::run(&cfg).err().map(|f| (seed, f.what))
    })
}

/// A copy promoted to primary that keeps serving continues its old primary's batch
/// numbers: a batch the old primary persisted on some members but never got
/// acknowledged and the new primary's different batch share a number, and the copies
/// diverge (or an acknowledged write is lost).
#[test]
fn the_simulator_finds_a_promoted_copy_that_keeps_serving() {
    let (seed, what) = find(Bug::PromotedKeepsServing, 300).expect("found within 300 seeds");
    eprintln!("seed {seed}: {what}");
}

/// A new primary that decides from the members that answered, not waiting for the
/// others when none was complete, starts from a copy that missed acknowledged batches.
#[test]
fn the_simulator_finds_a_takeover_that_does_not_wait_for_every_member() {
    let (seed, what) = find(Bug::TakeoverWithoutAllMembers, 300).expect("found within 300 seeds");
    eprintln!("seed {seed}: {what}");
}

/// The scale users run: 300 metadata nodes, 4,096 partitions, faults on.
#[test]
fn three_hundred_nodes_and_4096_partitions() {
    let cfg = Config {
        seed: env_u64("SHINGLE_SIM_SEED", 1),
        nodes: 300,
        partitions: 4096,
        ops: 3000,
        clients: 64,
        ..Config::default()
    };
    let r = sim::run(&cfg).unwrap_or_else(|f| panic!("{f}"));
    eprintln!(
        "300 nodes x 4096 partitions: {} acknowledged, {} given up, {} faults, {} virtual ms",
        r.acked, r.gave_up, r.faults, r.virtual_ms
    );
    assert_eq!(r.acked + r.gave_up, cfg.ops);
}
