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

/// Writes back dirty pages and drops the kernel's clean page cache, dentries and inodes
/// (root only: the benchmarks that call it mount, so they run as root). A failure is
/// said, not fatal: what follows then runs warm.
pub(crate) fn drop_kernel_caches() {
    let _ = std::process::Command::new("sync").status();
    if let Err(e) = std::fs::write("/proc/sys/vm/drop_caches", "3") {
        eprintln!("bench: could not drop the kernel's caches ({e}); the next phase runs warm");
    }
}
