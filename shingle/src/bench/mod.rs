//! Benchmarks, each runnable with one command (`shingle bench <what>`).

pub mod transport;
pub mod store;
