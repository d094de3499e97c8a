//! Namespace value types: file kinds, attributes, credentials, errno, name rules.

use crate::ids::{Ino, NodeId};
use serde::{Deserialize, Serialize};

/// Linux errno values the namespace returns, exactly as a local filesystem would.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[repr(i32)]
pub enum Errno {
    /// Operation not permitted.
    EPERM = 1,
    /// No such file or directory.
    ENOENT = 2,
    /// I/O error.
    EIO = 5,
    /// Try again (a replica is catching up, a lock is busy).
    EAGAIN = 11,
    /// Permission denied.
    EACCES = 13,
    /// Device or resource busy.
    EBUSY = 16,
    /// File exists.
    EEXIST = 17,
    /// Cross-device link.
    EXDEV = 18,
    /// Not a directory.
    ENOTDIR = 20,
    /// Is a directory.
    EISDIR = 21,
    /// Invalid argument.
    EINVAL = 22,
    /// File too large.
    EFBIG = 27,
    /// No space left on device.
    ENOSPC = 28,
    /// Read-only file system (a read-only client key).
    EROFS = 30,
    /// Too many links.
    EMLINK = 31,
    /// Result too large (xattr buffer).
    ERANGE = 34,
    /// File name too long.
    ENAMETOOLONG = 36,
    /// Directory not empty.
    ENOTEMPTY = 39,
    /// Too many levels of symbolic links.
    ELOOP = 40,
    /// No data available (missing xattr).
    ENODATA = 61,
    /// Value too large for defined data type.
    EOVERFLOW = 75,
    /// Operation not supported (unknown xattr namespace).
    EOPNOTSUPP = 95,
    /// Argument list too long (xattr value too large).
    E2BIG = 7,
    /// Stale handle / epoch.
    ESTALE = 116,
}

impl Errno {
    /// The numeric value.
    pub fn code(self) -> i32 {
        self as i32
    }

    /// From a numeric value (unknown values become EIO).
    pub fn from_code(c: i32) -> Errno {
        use Errno::*;
        [
            EPERM,
            ENOENT,
            EIO,
            EAGAIN,
            EACCES,
            EBUSY,
            EEXIST,
            EXDEV,
            ENOTDIR,
            EISDIR,
            EINVAL,
            EFBIG,
            ENOSPC,
            EROFS,
            EMLINK,
            ERANGE,
            ENAMETOOLONG,
            ENOTEMPTY,
            ELOOP,
            ENODATA,
            EOVERFLOW,
            EOPNOTSUPP,
            E2BIG,
            ESTALE,
        ]
        .into_iter()
        .find(|e| e.code() == c)
        .unwrap_or(EIO)
    }
}

impl std::fmt::Display for Errno {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

impl std::error::Error for Errno {}

/// Result of namespace operations.
pub type NsResult<T> = Result<T, Errno>;

/// Kind of an inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FileKind {
    /// Regular file.
    File,
    /// Directory.
    Dir,
    /// Symbolic link.
    Symlink,
    /// Named pipe.
    Fifo,
    /// Unix socket.
    Socket,
    /// Character device.
    CharDev,
    /// Block device.
    BlockDev,
}

impl FileKind {
    /// The S_IFMT bits.
    pub fn mode_bits(self) -> u32 {
        match self {
            FileKind::File => 0o100000,
            FileKind::Dir => 0o040000,
            FileKind::Symlink => 0o120000,
            FileKind::Fifo => 0o010000,
            FileKind::Socket => 0o140000,
            FileKind::CharDev => 0o020000,
            FileKind::BlockDev => 0o060000,
        }
    }

    /// The kind named by S_IFMT bits of `mode`.
    pub fn from_mode(mode: u32) -> Option<FileKind> {
        Some(match mode & 0o170000 {
            0o100000 | 0 => FileKind::File,
            0o040000 => FileKind::Dir,
            0o120000 => FileKind::Symlink,
            0o010000 => FileKind::Fifo,
            0o140000 => FileKind::Socket,
            0o020000 => FileKind::CharDev,
            0o060000 => FileKind::BlockDev,
            _ => return None,
        })
    }
}

/// Set-user-id bit.
pub const S_ISUID: u32 = 0o4000;
/// Set-group-id bit.
pub const S_ISGID: u32 = 0o2000;
/// Sticky bit.
pub const S_ISVTX: u32 = 0o1000;
/// Permission and special bits.
pub const PERM_MASK: u32 = 0o7777;

/// Nanoseconds since the Unix epoch.
pub type TimeNs = i64;

/// The current time as a [`TimeNs`] (0 for a clock before 1970): the metadata
/// service's and its clients' name for the one wall clock, `shingle_transport::clock`.
pub fn now_ns() -> TimeNs {
    shingle_transport::clock::now_ns()
}

/// Attributes of an inode (what GETATTR returns).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attr {
    /// Inode number.
    pub ino: Ino,
    /// Kind.
    pub kind: FileKind,
    /// Permission and special bits (no S_IFMT).
    pub perm: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Hard links (directories: 2 + subdirectories).
    pub nlink: u32,
    /// Size in bytes (symlinks: target length; directories: entry count).
    pub size: u64,
    /// Device number for device nodes.
    pub rdev: u64,
    /// Last access.
    pub atime: TimeNs,
    /// Last data change.
    pub mtime: TimeNs,
    /// Last status change.
    pub ctime: TimeNs,
    /// Creation.
    pub crtime: TimeNs,
}

/// The caller of an operation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Creds {
    /// Effective uid.
    pub uid: u32,
    /// Effective gid.
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
}

impl Creds {
    /// The superuser.
    pub fn root() -> Self {
        Creds {
            uid: 0,
            gid: 0,
            groups: Vec::new(),
        }
    }

    /// True when the caller is in `gid`.
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }
}

/// Attribute changes of SETATTR; `None` leaves a field alone.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetAttr {
    /// New permission bits.
    pub perm: Option<u32>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New size (truncate/extend).
    pub size: Option<u64>,
    /// New atime.
    pub atime: Option<TimeNs>,
    /// New mtime.
    pub mtime: Option<TimeNs>,
}

impl SetAttr {
    /// The time value that means "the service's now" (`UTIME_NOW`): allowed to anyone
    /// with write permission, where an explicit time needs ownership.
    pub const NOW: TimeNs = TimeNs::MIN;
}

/// Largest file size: sizes and offsets past it fail with `EFBIG` (clients) or are
/// refused by the metadata service (`EFBIG` for a truncate, `EINVAL` in a commit).
pub const MAX_FILE_BYTES: u64 = 1 << 62;

/// Largest stripe unit (bytes per shard); the data nodes' `ec::MAX_UNIT_BYTES`.
pub const MAX_UNIT_BYTES: u32 = 64 << 20;

/// Longest name component.
pub const NAME_MAX: usize = 255;
/// Longest symlink target.
pub const PATH_MAX: usize = 4096;
/// Most hard links to one inode.
pub const LINK_MAX: u32 = 65_000;

/// Checks a name component as Linux does for creation.
pub fn check_name(name: &[u8]) -> NsResult<()> {
    if name.len() > NAME_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    if name.is_empty() || name.contains(&b'/') || name.contains(&0) {
        return Err(Errno::EINVAL);
    }
    Ok(())
}

/// How a file's data is stored: the erasure-coding policy and, per stripe, the chunk
/// version and the nodes that held its shards when it was written (a hint: a stale hint
/// costs the reader one resolve, and the placement group gives the current nodes).
/// Directories hold a policy (no stripes) that new files and directories inherit.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layout {
    /// Data shards per stripe.
    pub k: u8,
    /// Parity shards per stripe.
    pub m: u8,
    /// Bytes per shard (a stripe holds `k * unit` bytes of file data).
    pub unit: u32,
    /// Written stripes by index.
    pub stripes: std::collections::BTreeMap<u64, StripeRec>,
    /// The next stripe version the metadata service will hand out for this file
    /// ([`crate::namespace::Namespace::reserve_versions`]): versions are unique per
    /// file and never come from a client's clock.
    pub next_version: u64,
}

impl Layout {
    /// Bytes of file data per stripe.
    pub fn stripe_bytes(&self) -> u64 {
        u64::from(self.k) * u64::from(self.unit)
    }

    /// The policy alone (k, m, unit; no stripes and no versions handed out), as a
    /// directory passes it on to new files. The data path's `EcPolicy` of a layout is
    /// `shingle_client::ec_policy`.
    pub fn without_stripes(&self) -> Layout {
        Layout {
            k: self.k,
            m: self.m,
            unit: self.unit,
            stripes: Default::default(),
            next_version: 0,
        }
    }

    /// Whether the policy can hold data, by the data nodes' rules too: 1 ≤ k, 1 ≤ m,
    /// k + m ≤ 32, a unit that is a positive multiple of 4 KiB of at most
    /// [`MAX_UNIT_BYTES`].
    pub fn policy_is_valid(&self) -> bool {
        let k = usize::from(self.k);
        k >= 1
            && self.m >= 1
            && k + usize::from(self.m) <= 32
            && self.unit != 0
            && self.unit % 4096 == 0
            && self.unit <= MAX_UNIT_BYTES
    }

    /// Drops stripes that lie wholly at or beyond `size`.
    pub fn truncate(&mut self, size: u64) {
        let sb = self.stripe_bytes().max(1);
        let keep = size.div_ceil(sb);
        self.stripes.retain(|s, _| *s < keep);
    }
}

/// One written stripe of a file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StripeRec {
    /// Version of its chunks (readers refuse older ones).
    pub version: u64,
    /// Bytes of file data the stripe was encoded with (the rest of it reads as zeros).
    pub len: u64,
    /// The node that took each shard 0..k+m, `None` where none did (a location hint).
    /// Stored and sent as node ids with 0 for `None`, the encoding it always had.
    #[serde(with = "shard_nodes")]
    pub nodes: Vec<Option<NodeId>>,
}

/// [`StripeRec::nodes`] on disk and on the wire: a node id per shard, 0 for none.
mod shard_nodes {
    use crate::ids::NodeId;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(nodes: &[Option<NodeId>], s: S) -> Result<S::Ok, S::Error> {
        let ids: Vec<u64> = nodes.iter().map(|n| n.map_or(0, |n| n.0)).collect();
        ids.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Option<NodeId>>, D::Error> {
        let ids = Vec::<u64>::deserialize(d)?;
        Ok(ids.into_iter().map(|id| (id != 0).then_some(NodeId(id))).collect())
    }
}

/// One stripe of a commit: the record written, and the version it replaces (what the
/// writer's read-modify-write was based on; 0: the stripe did not exist). The commit
/// applies only where every stripe still has its base version.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StripeWrite {
    /// Stripe index.
    pub stripe: u64,
    /// The version this write replaces (0: none).
    pub base: u64,
    /// The new record.
    pub rec: StripeRec,
}

/// A directory entry as READDIR returns it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    /// Name.
    pub name: Vec<u8>,
    /// Inode.
    pub ino: Ino,
    /// Kind.
    pub kind: FileKind,
    /// The inode's attributes, when the listing was asked with them and the inode's
    /// record lives in the entry's partition (a file with its first name); `None`
    /// otherwise (the caller asks for them apart).
    pub attr: Option<Attr>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_locations_keep_their_stored_encoding() {
        // Stripe records are on disk and on the wire: `Option<NodeId>` per shard must
        // encode exactly as the node ids (0 for none) it replaced.
        #[derive(Serialize)]
        struct Before {
            version: u64,
            len: u64,
            nodes: Vec<u64>,
        }
        let rec = StripeRec {
            version: 7,
            len: 4096,
            nodes: vec![Some(NodeId(1)), None, Some(NodeId(300))],
        };
        let before = Before {
            version: 7,
            len: 4096,
            nodes: vec![1, 0, 300],
        };
        let bytes = postcard::to_allocvec(&rec).expect("encode");
        assert_eq!(bytes, postcard::to_allocvec(&before).expect("encode"));
        assert_eq!(postcard::from_bytes::<StripeRec>(&bytes).expect("decode"), rec);
    }
}
