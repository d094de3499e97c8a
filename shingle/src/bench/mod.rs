//! Benchmarks, each runnable with one command (`shingle bench <what>`).

pub mod store;
pub mod transport;
