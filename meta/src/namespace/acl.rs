//! POSIX access control lists as Linux hands them to a filesystem, in the extended
//! attributes `system.posix_acl_access` and `system.posix_acl_default`: the byte format,
//! the kernel's validity rules, and the mode an ACL stands for.
//!
//! Shingle checks permission bits only (decision 0030). An access ACL with nothing but
//! the owner, owning-group and other entries says exactly what the permission bits say:
//! setting one sets the mode, and nothing is stored, as ext4 and XFS do. `cp -a`,
//! `rsync -A` and `tar --acls` set such an ACL on every file they copy. An ACL with
//! named users or groups (or a default ACL, which would change how new files take
//! their mode) is refused with `EOPNOTSUPP`: stored but not enforced it would grant
//! what it was written to deny.

use super::types::Errno;

/// The access ACL's attribute name.
pub const ACCESS: &[u8] = b"system.posix_acl_access";
/// The default ACL's attribute name (directories).
pub const DEFAULT: &[u8] = b"system.posix_acl_default";

/// The only format version Linux writes (`POSIX_ACL_XATTR_VERSION`).
const VERSION: u32 = 2;
const HEADER: usize = 4;
const ENTRY: usize = 8;

/// An entry's tag (`ACL_USER_OBJ` ... `ACL_OTHER`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tag {
    /// The file's owner.
    UserObj,
    /// A named user.
    User,
    /// The file's group.
    GroupObj,
    /// A named group.
    Group,
    /// The most the named entries and the group may be granted.
    Mask,
    /// Everyone else.
    Other,
}

impl Tag {
    fn from_wire(t: u16) -> Option<Tag> {
        Some(match t {
            0x01 => Tag::UserObj,
            0x02 => Tag::User,
            0x04 => Tag::GroupObj,
            0x08 => Tag::Group,
            0x10 => Tag::Mask,
            0x20 => Tag::Other,
            _ => return None,
        })
    }
}

/// One entry: a tag, read/write/execute bits (4/2/1) and, for named entries, the id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Whom the entry is for.
    pub tag: Tag,
    /// Read (4), write (2), execute (1).
    pub perm: u16,
    /// The user or group id of a named entry.
    pub id: u32,
}

/// Whether `name` is one of the two ACL attributes.
pub fn is_acl(name: &[u8]) -> bool {
    name == ACCESS || name == DEFAULT
}

/// Parses and checks an ACL attribute value. An empty list (an empty value, or the
/// header alone) is Linux's "remove the ACL". `EOPNOTSUPP` for another format version,
/// `EINVAL` for anything the kernel's `posix_acl_valid` would refuse: entries out of
/// order, an entry missing or twice, a named entry without a mask, unknown tags or bits.
pub fn parse(value: &[u8]) -> Result<Vec<Entry>, Errno> {
    if value.is_empty() {
        return Ok(Vec::new());
    }
    if value.len() < HEADER || (value.len() - HEADER) % ENTRY != 0 {
        return Err(Errno::EINVAL);
    }
    let version = u32::from_le_bytes(value[..HEADER].try_into().expect("4 bytes"));
    if version != VERSION {
        return Err(Errno::EOPNOTSUPP);
    }
    let entries = value[HEADER..]
        .chunks_exact(ENTRY)
        .map(|e| {
            let tag = Tag::from_wire(u16::from_le_bytes([e[0], e[1]])).ok_or(Errno::EINVAL)?;
            let perm = u16::from_le_bytes([e[2], e[3]]);
            let id = u32::from_le_bytes([e[4], e[5], e[6], e[7]]);
            if perm & !0o7 != 0 {
                return Err(Errno::EINVAL);
            }
            Ok(Entry { tag, perm, id })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if !entries.is_empty() {
        valid(&entries)?;
    }
    Ok(entries)
}

/// The kernel's order and completeness rules: the owner, named users, the group,
/// named groups, the mask (required when there are named entries), other.
fn valid(entries: &[Entry]) -> Result<(), Errno> {
    #[derive(PartialEq)]
    enum State {
        UserObj,
        User,
        Group,
        Other,
        Done,
    }
    let mut state = State::UserObj;
    let mut needs_mask = false;
    for e in entries {
        state = match (e.tag, state) {
            (Tag::UserObj, State::UserObj) => State::User,
            (Tag::User, State::User) if e.id != u32::MAX => {
                needs_mask = true;
                State::User
            }
            (Tag::GroupObj, State::User) => State::Group,
            (Tag::Group, State::Group) if e.id != u32::MAX => {
                needs_mask = true;
                State::Group
            }
            (Tag::Mask, State::Group) => State::Other,
            (Tag::Other, State::Other) => State::Done,
            (Tag::Other, State::Group) if !needs_mask => State::Done,
            _ => return Err(Errno::EINVAL),
        };
    }
    if state == State::Done {
        Ok(())
    } else {
        Err(Errno::EINVAL)
    }
}

/// The permission bits (0o777) a valid, non-empty ACL stands for, when they say all
/// it says (owner, group and other entries only); `None` when it names users or
/// groups or has a mask (Linux's `posix_acl_equiv_mode` answering "not equivalent").
pub fn equivalent_mode(entries: &[Entry]) -> Option<u32> {
    let mut mode = 0;
    for e in entries {
        let bits = u32::from(e.perm & 0o7);
        match e.tag {
            Tag::UserObj => mode |= bits << 6,
            Tag::GroupObj => mode |= bits << 3,
            Tag::Other => mode |= bits,
            Tag::User | Tag::Group | Tag::Mask => return None,
        }
    }
    Some(mode)
}

/// The attribute value of the ACL that permission bits `mode` stand for (what
/// `getfacl` shows for a file without an ACL); for tests and tools.
pub fn of_mode(mode: u32) -> Vec<u8> {
    let mut v = VERSION.to_le_bytes().to_vec();
    for (tag, shift) in [(0x01u16, 6), (0x04, 3), (0x20, 0)] {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&(((mode >> shift) & 0o7) as u16).to_le_bytes());
        v.extend_from_slice(&u32::MAX.to_le_bytes());
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
        let mut v = VERSION.to_le_bytes().to_vec();
        for (t, p, id) in entries {
            v.extend_from_slice(&t.to_le_bytes());
            v.extend_from_slice(&p.to_le_bytes());
            v.extend_from_slice(&id.to_le_bytes());
        }
        v
    }
    const U: u32 = u32::MAX;

    #[test]
    fn what_cp_a_sets_is_the_mode() {
        // The bytes `cp -a` passes for a 0755 directory (strace on Debian 12).
        let v = b"\x02\0\0\0\x01\0\x07\0\xff\xff\xff\xff\x04\0\x05\0\xff\xff\xff\xff\x20\0\x05\0\xff\xff\xff\xff";
        let e = parse(v).expect("valid");
        assert_eq!(equivalent_mode(&e), Some(0o755));
        for mode in [0, 0o644, 0o700, 0o777, 0o421] {
            assert_eq!(equivalent_mode(&parse(&of_mode(mode)).expect("valid")), Some(mode));
        }
    }

    #[test]
    fn named_entries_and_masks_are_not_a_mode() {
        let named = acl(&[(1, 6, U), (2, 6, 1000), (4, 4, U), (0x10, 6, U), (0x20, 4, U)]);
        assert_eq!(equivalent_mode(&parse(&named).expect("valid")), None);
        let mask_only = acl(&[(1, 6, U), (4, 4, U), (0x10, 4, U), (0x20, 4, U)]);
        assert_eq!(equivalent_mode(&parse(&mask_only).expect("valid")), None);
    }

    #[test]
    fn empty_is_removal() {
        assert_eq!(parse(b""), Ok(Vec::new()));
        assert_eq!(parse(&acl(&[])), Ok(Vec::new()));
    }

    #[test]
    fn malformed_values_are_refused() {
        assert_eq!(parse(b"\x02\0\0"), Err(Errno::EINVAL), "short header");
        assert_eq!(parse(&acl(&[(1, 6, U)])[..11]), Err(Errno::EINVAL), "torn entry");
        let mut v1 = of_mode(0o644);
        v1[0] = 1;
        assert_eq!(parse(&v1), Err(Errno::EOPNOTSUPP), "another version");
        let cases: &[(&str, Vec<u8>)] = &[
            ("no other", acl(&[(1, 6, U), (4, 4, U)])),
            ("no owner", acl(&[(4, 4, U), (0x20, 4, U)])),
            ("out of order", acl(&[(4, 4, U), (1, 6, U), (0x20, 4, U)])),
            ("owner twice", acl(&[(1, 6, U), (1, 6, U), (4, 4, U), (0x20, 4, U)])),
            (
                "named without mask",
                acl(&[(1, 6, U), (2, 6, 7), (4, 4, U), (0x20, 4, U)]),
            ),
            ("unknown tag", acl(&[(1, 6, U), (0x40, 4, U), (4, 4, U), (0x20, 4, U)])),
            ("unknown bits", acl(&[(1, 0o10, U), (4, 4, U), (0x20, 4, U)])),
            (
                "named with no id",
                acl(&[(1, 6, U), (2, 6, U), (4, 4, U), (0x10, 6, U), (0x20, 4, U)]),
            ),
            ("after other", acl(&[(1, 6, U), (4, 4, U), (0x20, 4, U), (0x20, 4, U)])),
        ];
        for (what, v) in cases {
            assert_eq!(parse(v), Err(Errno::EINVAL), "{what}");
        }
    }

    proptest::proptest! {
        /// Any bytes: parsed or refused, never a panic; whatever parses is valid and,
        /// when it is a mode, written back the same.
        #[test]
        fn any_bytes_parse_or_are_refused(v in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64)) {
            if let Ok(e) = parse(&v) {
                if let Some(mode) = equivalent_mode(&e).filter(|_| !e.is_empty()) {
                    proptest::prop_assert_eq!(equivalent_mode(&parse(&of_mode(mode)).expect("valid")), Some(mode));
                }
            }
        }
    }
}
