//! Benchmarks, each runnable with one command (`shingle bench <what>`).

pub mod ec;
pub mod store;
pub mod transport;
