//! The one wall clock of every Shingle process (monotonic waits use
//! `std::time::Instant`). Times that are stored, compared across machines or signed —
//! inode times, leases in records, capability expiries — all come from here, so a test
//! or a future simulated clock has one place to hook.

/// Nanoseconds since the Unix epoch (0 for a clock before 1970).
#[allow(clippy::disallowed_methods)] // the one place that reads the wall clock
pub fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// Whole seconds since the Unix epoch (0 for a clock before 1970).
pub fn now_secs() -> u64 {
    u64::try_from(now_ns() / 1_000_000_000).unwrap_or(0)
}
