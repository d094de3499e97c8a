//! Benchmarks, each runnable with one command (`shingle bench <what>`).

pub mod ec;
pub mod fabric;
pub mod failover;
pub mod layout;
pub mod loader;
pub mod meta;
pub mod mutate;
pub mod store;
pub mod transport;

/// The median of a set of measurements (the upper one for an even count).
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}
