//! POSIX permission rules, as pure functions (the same rules Linux applies for a local
//! filesystem without ACLs).

use super::types::{Attr, Creds, Errno, FileKind, MAX_FILE_BYTES, NsResult, S_ISGID, S_ISUID, S_ISVTX, SetAttr};

/// Read permission bit in an access mask.
pub const R: u32 = 4;
/// Write permission bit.
pub const W: u32 = 2;
/// Execute/search permission bit.
pub const X: u32 = 1;

/// Whether `creds` may access `attr` with `mask` (a combination of R, W, X).
pub fn may(creds: &Creds, attr: &Attr, mask: u32) -> bool {
    if creds.uid == 0 {
        // Root: everything, except execute needs some x bit on non-directories.
        return mask & X == 0 || attr.kind == FileKind::Dir || attr.perm & 0o111 != 0;
    }
    let bits = if creds.uid == attr.uid {
        (attr.perm >> 6) & 7
    } else if creds.in_group(attr.gid) {
        (attr.perm >> 3) & 7
    } else {
        attr.perm & 7
    };
    bits & mask == mask
}

/// Whether `creds` may have a file's data at all (a shard capability): as its owner,
/// or with read or write permission. A writer reads the stripes it changes in part.
pub fn may_open_data(creds: &Creds, attr: &Attr) -> bool {
    creds.uid == attr.uid || may(creds, attr, R) || may(creds, attr, W)
}

/// EACCES unless `may`.
pub fn check(creds: &Creds, attr: &Attr, mask: u32) -> NsResult<()> {
    if may(creds, attr, mask) {
        Ok(())
    } else {
        Err(Errno::EACCES)
    }
}

/// May `creds` remove or rename the entry for `victim` from directory `dir`? Needs
/// write+search on the directory and, with the sticky bit set, ownership of the
/// directory or of the victim.
pub fn check_delete(creds: &Creds, dir: &Attr, victim: &Attr) -> NsResult<()> {
    check(creds, dir, W | X)?;
    if dir.perm & S_ISVTX != 0 && creds.uid != 0 && creds.uid != dir.uid && creds.uid != victim.uid {
        return Err(Errno::EPERM);
    }
    Ok(())
}

/// The group and permission bits of a new inode created by `creds` in `dir`: a setgid
/// directory gives its group (and, to new directories, its setgid bit); a non-member
/// creating a file loses the setgid bit it asked for.
pub fn new_owner(creds: &Creds, dir: &Attr, kind: FileKind, perm: u32) -> (u32, u32) {
    let mut perm = perm & 0o7777;
    let gid = if dir.perm & S_ISGID != 0 {
        if kind == FileKind::Dir {
            perm |= S_ISGID;
        }
        dir.gid
    } else {
        creds.gid
    };
    if kind != FileKind::Dir && perm & S_ISGID != 0 && creds.uid != 0 && !creds.in_group(gid) {
        perm &= !S_ISGID;
    }
    (gid, perm)
}

/// Checks a SETATTR against the rules of chmod, chown, truncate and utimes, and
/// returns the attributes after it (ctime is the caller's to set).
pub fn apply_setattr(creds: &Creds, attr: &Attr, set: &SetAttr, now: i64) -> NsResult<Attr> {
    let owner = creds.uid == 0 || creds.uid == attr.uid;
    let mut a = attr.clone();
    if let Some(size) = set.size {
        if attr.kind == FileKind::Dir {
            return Err(Errno::EISDIR);
        }
        if attr.kind != FileKind::File {
            return Err(Errno::EINVAL);
        }
        check(creds, attr, W)?;
        if size > MAX_FILE_BYTES {
            return Err(Errno::EFBIG);
        }
        a.size = size;
        a.mtime = now;
        // Writing to a file by a non-owner clears setuid/setgid like write(2) does.
        if creds.uid != 0 {
            a.perm &= !S_ISUID;
            if a.perm & 0o010 != 0 {
                a.perm &= !S_ISGID;
            }
        }
    }
    if set.uid.is_some() || set.gid.is_some() {
        let new_uid = set.uid.unwrap_or(attr.uid);
        let new_gid = set.gid.unwrap_or(attr.gid);
        if creds.uid != 0 {
            // Only root changes the owner; the owner may change the group to one of theirs.
            if new_uid != attr.uid || !owner || (new_gid != attr.gid && !creds.in_group(new_gid)) {
                return Err(Errno::EPERM);
            }
        }
        if (new_uid != attr.uid || new_gid != attr.gid) && attr.kind != FileKind::Dir {
            // chown clears setuid, and setgid when group-execute is set.
            a.perm &= !S_ISUID;
            if a.perm & 0o010 != 0 {
                a.perm &= !S_ISGID;
            }
        }
        a.uid = new_uid;
        a.gid = new_gid;
    }
    if let Some(perm) = set.perm {
        // What a write by a non-owner asks for (the kernel's kill-suid): clearing only
        // set-user-id / set-group-id, allowed to anyone who may write the file.
        let kill_suid = attr.perm & (S_ISUID | S_ISGID) != 0
            && perm & 0o7777 == attr.perm & 0o7777 & !(S_ISUID | S_ISGID)
            && may(creds, attr, W);
        if !owner && !kill_suid {
            return Err(Errno::EPERM);
        }
        let mut p = perm & 0o7777;
        if creds.uid != 0 && attr.kind != FileKind::Dir && !creds.in_group(a.gid) {
            p &= !S_ISGID;
        }
        a.perm = p;
    }
    for (want, slot) in [(set.atime, &mut a.atime), (set.mtime, &mut a.mtime)] {
        if let Some(t) = want {
            // Setting explicit times needs ownership; "now" needs write access.
            let is_now = t == SetAttr::NOW || t == now;
            if !(owner || (is_now && may(creds, attr, W))) {
                return Err(if is_now { Errno::EACCES } else { Errno::EPERM });
            }
            *slot = if t == SetAttr::NOW { now } else { t };
        }
    }
    Ok(a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::Ino;

    fn attr(kind: FileKind, perm: u32, uid: u32, gid: u32) -> Attr {
        Attr {
            ino: Ino(5),
            kind,
            perm,
            uid,
            gid,
            nlink: 1,
            size: 0,
            rdev: 0,
            atime: 0,
            mtime: 0,
            ctime: 0,
            crtime: 0,
        }
    }

    fn user(uid: u32, gid: u32, groups: &[u32]) -> Creds {
        Creds {
            uid,
            gid,
            groups: groups.to_vec(),
        }
    }

    #[test]
    fn owner_group_other_bits() {
        let f = attr(FileKind::File, 0o640, 10, 20);
        assert!(may(&user(10, 99, &[]), &f, R | W));
        assert!(!may(&user(10, 99, &[]), &f, X));
        assert!(may(&user(11, 20, &[]), &f, R));
        assert!(!may(&user(11, 20, &[]), &f, W));
        assert!(may(&user(11, 1, &[20]), &f, R), "supplementary group");
        assert!(!may(&user(12, 1, &[]), &f, R));
        // The owner class applies even when it is stricter than the group's.
        let g = attr(FileKind::File, 0o070, 10, 20);
        assert!(!may(&user(10, 20, &[]), &g, R));
        assert!(may(&Creds::root(), &f, R | W));
        assert!(!may(&Creds::root(), &f, X), "root needs some x bit to execute");
        assert!(
            may(&Creds::root(), &attr(FileKind::Dir, 0, 1, 1), X),
            "root searches any directory"
        );
    }

    #[test]
    fn sticky_directories_protect_other_users_entries() {
        let tmp = attr(FileKind::Dir, 0o1777, 0, 0);
        let mine = attr(FileKind::File, 0o644, 10, 10);
        assert_eq!(check_delete(&user(10, 10, &[]), &tmp, &mine), Ok(()));
        assert_eq!(check_delete(&user(11, 11, &[]), &tmp, &mine), Err(Errno::EPERM));
        assert_eq!(check_delete(&Creds::root(), &tmp, &mine), Ok(()));
        let closed = attr(FileKind::Dir, 0o755, 0, 0);
        assert_eq!(check_delete(&user(10, 10, &[]), &closed, &mine), Err(Errno::EACCES));
    }

    #[test]
    fn setgid_directories_pass_their_group_down() {
        let d = attr(FileKind::Dir, 0o2775, 0, 50);
        assert_eq!(new_owner(&user(10, 10, &[]), &d, FileKind::File, 0o644), (50, 0o644));
        assert_eq!(new_owner(&user(10, 10, &[]), &d, FileKind::Dir, 0o755), (50, 0o2755));
        let plain = attr(FileKind::Dir, 0o755, 0, 50);
        assert_eq!(
            new_owner(&user(10, 10, &[]), &plain, FileKind::File, 0o2755),
            (10, 0o2755)
        );
        assert_eq!(
            new_owner(&user(10, 10, &[]), &d, FileKind::File, 0o2755),
            (50, 0o0755),
            "not a member of 50"
        );
    }

    #[test]
    #[allow(clippy::too_many_lines)] // one table of rules, read top to bottom
    fn chmod_chown_truncate_rules() {
        let f = attr(FileKind::File, 0o6755, 10, 10);
        let owner = user(10, 10, &[20]);
        let other = user(11, 11, &[]);
        assert_eq!(
            apply_setattr(
                &other,
                &f,
                &SetAttr {
                    perm: Some(0o777),
                    ..Default::default()
                },
                1
            ),
            Err(Errno::EPERM)
        );
        assert_eq!(
            apply_setattr(
                &owner,
                &f,
                &SetAttr {
                    perm: Some(0o700),
                    ..Default::default()
                },
                1
            )
            .map(|a| a.perm),
            Ok(0o700)
        );
        assert_eq!(
            apply_setattr(
                &owner,
                &f,
                &SetAttr {
                    uid: Some(11),
                    ..Default::default()
                },
                1
            ),
            Err(Errno::EPERM)
        );
        assert_eq!(
            apply_setattr(
                &owner,
                &f,
                &SetAttr {
                    gid: Some(30),
                    ..Default::default()
                },
                1
            ),
            Err(Errno::EPERM)
        );
        let a = apply_setattr(
            &owner,
            &f,
            &SetAttr {
                gid: Some(20),
                ..Default::default()
            },
            1,
        )
        .expect("chgrp");
        assert_eq!((a.gid, a.perm), (20, 0o0755), "chgrp clears setuid and setgid");
        let a = apply_setattr(
            &Creds::root(),
            &f,
            &SetAttr {
                uid: Some(99),
                ..Default::default()
            },
            1,
        )
        .expect("chown");
        assert_eq!(a.uid, 99);
        assert_eq!(
            apply_setattr(
                &other,
                &f,
                &SetAttr {
                    size: Some(0),
                    ..Default::default()
                },
                1
            ),
            Err(Errno::EACCES)
        );
        let d = attr(FileKind::Dir, 0o755, 10, 10);
        assert_eq!(
            apply_setattr(
                &owner,
                &d,
                &SetAttr {
                    size: Some(0),
                    ..Default::default()
                },
                1
            ),
            Err(Errno::EISDIR)
        );
        assert_eq!(
            apply_setattr(
                &other,
                &f,
                &SetAttr {
                    mtime: Some(5),
                    ..Default::default()
                },
                1
            ),
            Err(Errno::EPERM)
        );
    }
}
