//! On-disk format versions of the metadata stores, and the one rule for them: a store
//! is opened only by a build that reads its format. A store without a recorded format
//! was written before formats were recorded, which is format 1; opening it records 1.
//! A newer format (written by a newer release) is refused with both numbers, never
//! misread. See docs/operations.md "Versions".

/// Format of a metadata node's partition store (`meta.redb`). 1: a file's stripes
/// inside its inode record; 2: one record per stripe (a store of format 1 is
/// rewritten at open); 3: behind a write-ahead log (`meta.wal`), which an older build
/// would not replay.
pub const META_STORE_FORMAT: u64 = 3;
/// Format of a manager's Raft store (`manager.redb`).
pub const MANAGER_STORE_FORMAT: u64 = 1;

/// Whether a store whose recorded format is `found` may be opened by a build that
/// writes `current` (`what` names the store in the refusal).
pub fn check(what: &str, found: Option<u64>, current: u64) -> Result<(), String> {
    match found {
        None => Ok(()),
        Some(v) if (1..=current).contains(&v) => Ok(()),
        Some(v) => Err(format!(
            "{what} has on-disk format {v}; this build reads formats 1 to {current} \
             (a newer release wrote it: run that release, see docs/operations.md \"Versions\")"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn older_and_unrecorded_formats_open_newer_ones_are_refused() {
        assert_eq!(check("x", None, 2), Ok(()));
        assert_eq!(check("x", Some(1), 2), Ok(()));
        assert_eq!(check("x", Some(2), 2), Ok(()));
        let e = check("the store", Some(3), 2).expect_err("newer");
        assert!(
            e.starts_with("the store has on-disk format 3; this build reads formats 1 to 2"),
            "{e}"
        );
        assert!(check("x", Some(0), 2).is_err(), "0 is no format");
    }
}
