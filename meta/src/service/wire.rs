//! Wire messages of the namespace service. All kinds live in `0x0400..=0x04FF`.
//!
//! | kind     | name        | from → to                     | what                                   |
//! |----------|-------------|-------------------------------|----------------------------------------|
//! | `0x0400` | [`Read`]    | client → any serving replica  | lookup, getattr, readlink, xattrs, readdir |
//! | `0x0401` | [`Op`]      | client → coordinator          | a mutating namespace operation         |
//! | `0x0402` | [`Fetch`]   | coordinator → primary         | records an operation reads             |
//! | `0x0403` | [`Execute`] | coordinator → primary         | a batch of partition changes           |
//! | `0x0404` | [`Alloc`]   | coordinator → primary         | a fresh counter of a partition         |
//! | `0x0405` | [`Lock`]    | coordinator → lock host       | take or release inode locks            |
//! | `0x0406` | [`Replicate`] | primary → replica           | one numbered batch                     |
//! | `0x0408` | [`SyncMe`]  | replica → primary             | "send me my copy" (catch-up)           |
//! | `0x0409` | [`Pull`]    | new primary → old members     | the position of their copy             |
//! | `0x040A` | [`Stats`]   | tools → node                  | counts for statfs and status           |
//! | `0x040B` | [`InstallPiece`] | primary → replica        | a piece of a partition's copy          |
//! | `0x040C` | [`PullPiece`] | new primary → best member   | a piece of that member's copy          |
//! | `0x040D` | [`Settled`] | lock host → primary           | "nothing left unfinished by an earlier primary?" |
//! | `0x040E` | [`Fence`]   | primary → dropped holder      | "have you adopted this epoch?" (its copy stopped) |
//! | `0x040F` | [`Expect`]  | coordinator → directory's primary | counts a directory will get after an answer |
//! | `0x0410` | [`Quiet`]   | coordinator → every node      | "counts still to apply to these directories?" |
//!
//! Payloads are [postcard](https://docs.rs/postcard) encodings of the serde types below
//! (decision 0007): the namespace types are already serde, and a compact, schema-checked
//! binary encoding costs less than mirroring forty of them in protobuf. Messages only
//! travel between nodes of one release; a decode failure is a clean `InvalidRequest`.
//!
//! Errors: a namespace errno travels as `Code::Application` with `app_code` = errno. A
//! server whose map is older or newer than the caller's, or that is not the primary the
//! caller thought, answers `Code::StaleEpoch`: the caller refreshes its map and retries.

pub use super::copy::CopyId;
use crate::ids::{Epoch, Ino, NodeId, PartitionId};
use crate::namespace::{Attr, Creds, DentryVal, DirEntry, Errno, InodeRec, Intent, Layout, Mutation, StripeWrite};
use crate::namespace::{Purge, RenameFlags, SetAttr, StripeRec, TimeNs, XattrMode};
use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use shingle_transport::{CallOptions, Code, MsgKind, RpcChannel, Status, TransportError};
use std::net::SocketAddr;

/// A namespace-service message: its kind and reply type.
pub trait MetaRpc: Serialize + DeserializeOwned + Send + Sync + 'static {
    /// Message kind.
    const KIND: MsgKind;
    /// Reply type.
    type Reply: Serialize + DeserializeOwned + Send + 'static;
}

macro_rules! meta_rpc {
    ($t:ty, $kind:expr, $reply:ty) => {
        impl MetaRpc for $t {
            const KIND: MsgKind = MsgKind($kind);
            type Reply = $reply;
        }
    };
}

/// Reads served by any replica that has caught up.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Read {
    /// The caller's map epoch.
    pub epoch: Epoch,
    /// What to read.
    pub op: ReadOp,
}

/// The read operations.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReadOp {
    /// An entry of `parent` (at partition hash(parent, name)). Search permission on the
    /// parent is the client's to check with the parent's attributes (it holds them).
    Lookup {
        /// Directory.
        parent: Ino,
        /// Name.
        name: Vec<u8>,
    },
    /// Attributes (at the inode's partition).
    GetAttr(Ino),
    /// The inode: attributes, symlink target, layout with the records of its first
    /// [`HEAD_STRIPES`] stripes (at the inode's partition; the rest: [`ReadOp::Stripes`]).
    GetInode(Ino),
    /// Committed stripe records of a file with index ≥ `from`, in order, at most
    /// `limit` (≤ [`MAX_STRIPES_READ`]).
    Stripes {
        /// The file.
        ino: Ino,
        /// First stripe index.
        from: u64,
        /// Most records.
        limit: u32,
    },
    /// One extended attribute.
    GetXattr {
        /// Caller.
        creds: Creds,
        /// Inode.
        ino: Ino,
        /// Name.
        name: Vec<u8>,
    },
    /// Extended attribute names.
    ListXattr {
        /// Caller.
        creds: Creds,
        /// Inode.
        ino: Ino,
    },
    /// Removed files of `partition` waiting for their data to be purged, after `after`.
    Purges {
        /// Partition.
        partition: PartitionId,
        /// Cursor: the last inode already returned.
        after: Ino,
        /// At most this many.
        limit: u32,
    },
    /// Whether the inode exists or its data waits for a purge (an orphan sweep asks
    /// before deleting shards nothing names).
    Alive(Ino),
    /// Entries of `dir` after `after` in name order from each of `partitions` held here.
    ReadDir {
        /// Directory.
        dir: Ino,
        /// Cursor: the last name already returned.
        after: Option<Vec<u8>>,
        /// At most this many entries.
        limit: u32,
        /// Partitions to list.
        partitions: Vec<PartitionId>,
        /// Each entry with its inode's attributes where the inode lives in the
        /// entry's partition ([`DirEntry::attr`]; READDIRPLUS).
        plus: bool,
    },
    /// [`ReadOp::GetInode`] for a caller with a client key, who also needs a shard
    /// capability to read the file's shards: the reply carries one when `creds` own
    /// the file or may read or write it (empty otherwise; the data nodes then refuse).
    GetInodeAs {
        /// Caller (squashed as its grant says).
        creds: Creds,
        /// Inode.
        ino: Ino,
    },
    /// [`ReadOp::Lookup`] as a client key sends it (variants are appended: an older
    /// node's encodings of the others stay the same): the node checks `creds` (squashed as
    /// its grant says) may search `parent`, which it does not take a client key's word
    /// for (a plain `Lookup` from one is refused).
    LookupAs {
        /// Caller.
        creds: Creds,
        /// Directory.
        parent: Ino,
        /// Name.
        name: Vec<u8>,
    },
    /// [`ReadOp::ReadDir`] as a client key sends it: each node checks `creds` may read
    /// `dir`.
    ReadDirAs {
        /// Caller.
        creds: Creds,
        /// Directory.
        dir: Ino,
        /// Cursor: the last name already returned.
        after: Option<Vec<u8>>,
        /// At most this many entries.
        limit: u32,
        /// Partitions to list.
        partitions: Vec<PartitionId>,
        /// Each entry with its inode's attributes where the inode lives in the
        /// entry's partition ([`DirEntry::attr`]; READDIRPLUS).
        plus: bool,
    },
    /// [`ReadOp::GetAttr`] from the inode's primary, with the counts and times that
    /// answered operations will still add to it ([`Expect`]): a directory's follow a
    /// create's or an unlink's answer (`coordinator::answer_before`), and the client
    /// that made the change reads them this way until they have surely landed
    /// ([`SETTLE_WINDOW`]).
    GetAttrSettled(Ino),
}

/// How long after a mutation its client reads the directories it changed with
/// [`ReadOp::GetAttrSettled`].
pub const SETTLE_WINDOW: std::time::Duration = std::time::Duration::from_secs(2);

impl ReadOp {
    /// The operation's name (a trace attribute).
    pub fn name(&self) -> &'static str {
        match self {
            ReadOp::Lookup { .. } | ReadOp::LookupAs { .. } => "lookup",
            ReadOp::GetAttr(_) | ReadOp::GetAttrSettled(_) => "getattr",
            ReadOp::GetInode(_) => "get_inode",
            ReadOp::Stripes { .. } => "stripes",
            ReadOp::GetXattr { .. } => "getxattr",
            ReadOp::ListXattr { .. } => "listxattr",
            ReadOp::ReadDir { .. } | ReadOp::ReadDirAs { .. } => "readdir",
            ReadOp::Purges { .. } => "purges",
            ReadOp::Alive(_) => "alive",
            ReadOp::GetInodeAs { .. } => "get_inode",
        }
    }

    /// The inode it reads (the directory, for a lookup or a listing).
    pub fn ino(&self) -> Ino {
        match self {
            ReadOp::Lookup { parent: ino, .. }
            | ReadOp::LookupAs { parent: ino, .. }
            | ReadOp::ReadDirAs { dir: ino, .. }
            | ReadOp::GetAttr(ino)
            | ReadOp::GetAttrSettled(ino)
            | ReadOp::GetInode(ino)
            | ReadOp::Stripes { ino, .. }
            | ReadOp::GetXattr { ino, .. }
            | ReadOp::ListXattr { ino, .. }
            | ReadOp::ReadDir { dir: ino, .. }
            | ReadOp::Purges { after: ino, .. }
            | ReadOp::Alive(ino)
            | ReadOp::GetInodeAs { ino, .. } => *ino,
        }
    }
}

/// Replies to [`Read`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReadReply {
    /// Lookup: the entry, with the inode's attributes when its partition is this one.
    Entry(DentryVal, Option<Attr>),
    /// GetAttr.
    Attr(Attr),
    /// GetInode.
    Inode(Box<InodeRec>),
    /// Stripes: (index, record) in order, whether more follow, and the file's
    /// attributes as of the same moment (a reader that loads a layout in windows
    /// checks they all come from one version of the file).
    Stripes(Vec<(u64, StripeRec)>, bool, Box<Attr>),
    /// GetXattr.
    Value(Vec<u8>),
    /// ListXattr.
    Names(Vec<Vec<u8>>),
    /// ReadDir: entries (name order), and the partitions this node could not list.
    Entries(Vec<DirEntry>, Vec<PartitionId>),
    /// Purges: removed files waiting, in inode order.
    Purges(Vec<(Ino, Purge)>),
    /// Alive.
    Alive(bool),
    /// GetInodeAs: the inode, and a read capability for its shards (empty: none).
    InodeCap(Box<InodeRec>, Vec<u8>),
}
meta_rpc!(Read, 0x0400, ReadReply);

/// A mutating operation, sent to the primary of its anchor partition, which coordinates it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Op {
    /// The caller's map epoch.
    pub epoch: Epoch,
    /// The caller.
    pub creds: Creds,
    /// What to do.
    pub op: NsOp,
    /// The operation's id, the same on every retry (0: none). An unlink, rmdir, rename
    /// or link whose id its anchor partition records as done is answered as done and
    /// not run again (see [`NsOp::once`]).
    pub id: u64,
}

/// Versions handed out by a create (see [`NsOp::Mknod`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateReserve {
    /// The file's policy when its directory sets none (stripes and versions ignored).
    pub policy: crate::namespace::Layout,
    /// How many versions, 1 to [`crate::namespace::MAX_CREATE_RESERVE`].
    pub count: u32,
}

/// The mutating operations.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NsOp {
    /// mknod / mkdir / symlink / create.
    Mknod {
        /// Directory.
        parent: Ino,
        /// Name.
        name: Vec<u8>,
        /// Kind.
        kind: crate::namespace::FileKind,
        /// Permission bits (umask applied by the caller).
        perm: u32,
        /// Device number.
        rdev: u64,
        /// Symlink target.
        target: Option<Vec<u8>>,
        /// Unique per create, the same across its retries (0: none): makes a retried
        /// create exactly-once.
        token: u64,
        /// For a regular file: stripe versions `1..=count` handed to its creator with
        /// the create (and the policy the file takes when its directory has none), so
        /// a new file's first stores need no `ReserveVersions` of their own.
        reserve: Option<CreateReserve>,
    },
    /// link.
    Link {
        /// Existing inode.
        ino: Ino,
        /// New directory.
        newparent: Ino,
        /// New name.
        newname: Vec<u8>,
    },
    /// unlink.
    Unlink {
        /// Directory.
        parent: Ino,
        /// Name.
        name: Vec<u8>,
        /// When this removes a file's last link, keep its data this many seconds (the
        /// caller has it open and renews the hold); 0: purge it.
        keep_secs: u32,
    },
    /// rmdir.
    Rmdir {
        /// Directory.
        parent: Ino,
        /// Name.
        name: Vec<u8>,
    },
    /// rename / renameat2.
    Rename {
        /// Source directory.
        parent: Ino,
        /// Source name.
        name: Vec<u8>,
        /// Target directory.
        newparent: Ino,
        /// Target name.
        newname: Vec<u8>,
        /// RENAME_NOREPLACE.
        noreplace: bool,
        /// RENAME_EXCHANGE.
        exchange: bool,
    },
    /// setattr.
    SetAttr {
        /// Inode.
        ino: Ino,
        /// Changes.
        set: SetAttr,
    },
    /// setxattr.
    SetXattr {
        /// Inode.
        ino: Ino,
        /// Name.
        name: Vec<u8>,
        /// Value.
        value: Vec<u8>,
        /// 0 any, 1 create, 2 replace.
        mode: u8,
    },
    /// removexattr.
    RemoveXattr {
        /// Inode.
        ino: Ino,
        /// Name.
        name: Vec<u8>,
    },
    /// Sets the EC policy of a directory or empty file.
    SetLayout {
        /// Inode.
        ino: Ino,
        /// Policy (no stripes).
        policy: Layout,
    },
    /// Commits written stripes and the new size of a file (compare-and-set on the
    /// versions the writes were based on).
    CommitWrite {
        /// File.
        ino: Ino,
        /// The policy the stripes were written with.
        policy: Layout,
        /// New size (grows only).
        size: u64,
        /// Stripes written.
        stripes: Vec<StripeWrite>,
    },
    /// Hands out stripe versions of a file to a writer.
    ReserveVersions {
        /// File.
        ino: Ino,
        /// The policy the writer will write with (taken by a file without data).
        policy: Layout,
        /// How many.
        count: u32,
    },
    /// Keeps a removed file's data for `secs` more seconds (0 releases it): a client
    /// still has it open (root only).
    HoldPurge {
        /// The removed file.
        ino: Ino,
        /// Seconds from now.
        secs: u32,
    },
    /// A removed file's data was deleted on the data nodes (root only).
    Purged {
        /// The removed file.
        ino: Ino,
    },
    /// Records new shard locations of a stripe after a repair (root only).
    RelocateShards {
        /// File.
        ino: Ino,
        /// Stripe index.
        stripe: u64,
        /// The stripe version the repair rebuilt (no-op when it changed since).
        version: u64,
        /// (shard index, node id).
        moves: Vec<(u32, u64)>,
    },
    /// [`NsOp::CommitWrite`], then [`NsOp::SetAttr`] of the same file, in one batch: a
    /// setattr through a handle with uncommitted writes (cp -a sets times and owner
    /// before it closes) orders after them at the cost of one replicated commit.
    CommitWriteSetAttr {
        /// File.
        ino: Ino,
        /// The policy the stripes were written with.
        policy: Layout,
        /// New size (grows only).
        size: u64,
        /// Stripes written.
        stripes: Vec<StripeWrite>,
        /// The changes applied after the commit (no size: a size change has its own
        /// path through the file's content).
        set: SetAttr,
    },
}

impl NsOp {
    /// Whether a retry of this operation is answered from the record of its first try
    /// ([`crate::namespace::Namespace::once`]): those whose second run would see the
    /// first's effect as an error, or which a late copy would redo after others undid
    /// it (a create whose name was removed since; its token still finds the inode it
    /// made for a retry, [`NsOp::Mknod`]). The others set absolute values and may run
    /// twice.
    pub fn once(&self) -> bool {
        matches!(
            self,
            NsOp::Mknod { .. } | NsOp::Unlink { .. } | NsOp::Rmdir { .. } | NsOp::Rename { .. } | NsOp::Link { .. }
        )
    }

    /// The partition whose primary coordinates this operation (and holds its intent).
    pub fn anchor(&self, partitions: u32) -> PartitionId {
        use crate::placement::dentry_partition as dp;
        match self {
            NsOp::Mknod { parent, name, .. } | NsOp::Unlink { parent, name, .. } | NsOp::Rmdir { parent, name } => {
                dp(*parent, name, partitions)
            }
            NsOp::Link { newparent, newname, .. } | NsOp::Rename { newparent, newname, .. } => {
                dp(*newparent, newname, partitions)
            }
            NsOp::SetAttr { ino, .. }
            | NsOp::SetXattr { ino, .. }
            | NsOp::RemoveXattr { ino, .. }
            | NsOp::SetLayout { ino, .. }
            | NsOp::CommitWrite { ino, .. }
            | NsOp::CommitWriteSetAttr { ino, .. }
            | NsOp::ReserveVersions { ino, .. }
            | NsOp::HoldPurge { ino, .. }
            | NsOp::Purged { ino }
            | NsOp::RelocateShards { ino, .. } => ino.partition(),
        }
    }

    /// The operation's name (a trace attribute).
    pub fn name(&self) -> &'static str {
        match self {
            NsOp::Mknod { .. } => "mknod",
            NsOp::Link { .. } => "link",
            NsOp::Unlink { .. } => "unlink",
            NsOp::Rmdir { .. } => "rmdir",
            NsOp::Rename { .. } => "rename",
            NsOp::SetAttr { .. } => "setattr",
            NsOp::SetXattr { .. } => "setxattr",
            NsOp::RemoveXattr { .. } => "removexattr",
            NsOp::SetLayout { .. } => "setlayout",
            NsOp::CommitWrite { .. } => "commit_write",
            NsOp::ReserveVersions { .. } => "reserve_versions",
            NsOp::HoldPurge { .. } => "hold_purge",
            NsOp::Purged { .. } => "purged",
            NsOp::RelocateShards { .. } => "relocate_shards",
            NsOp::CommitWriteSetAttr { .. } => "commit_write_setattr",
        }
    }

    /// The inode it changes (the directory, for operations on names).
    pub fn ino(&self) -> Ino {
        match self {
            NsOp::Mknod { parent: ino, .. }
            | NsOp::Unlink { parent: ino, .. }
            | NsOp::Rmdir { parent: ino, .. }
            | NsOp::Rename { parent: ino, .. }
            | NsOp::Link { ino, .. }
            | NsOp::SetAttr { ino, .. }
            | NsOp::SetXattr { ino, .. }
            | NsOp::RemoveXattr { ino, .. }
            | NsOp::SetLayout { ino, .. }
            | NsOp::CommitWrite { ino, .. }
            | NsOp::CommitWriteSetAttr { ino, .. }
            | NsOp::ReserveVersions { ino, .. }
            | NsOp::HoldPurge { ino, .. }
            | NsOp::Purged { ino }
            | NsOp::RelocateShards { ino, .. } => *ino,
        }
    }

    /// The directories whose counts and times it changes: they may be applied after
    /// the operation's answer (`coordinator::answer_before`), so its client reads them
    /// with [`ReadOp::GetAttrSettled`] for a while.
    pub fn dirs_adjusted(&self) -> Vec<Ino> {
        match self {
            NsOp::Mknod { parent, .. } | NsOp::Unlink { parent, .. } | NsOp::Rmdir { parent, .. } => vec![*parent],
            NsOp::Link { newparent, .. } => vec![*newparent],
            NsOp::Rename { parent, newparent, .. } => vec![*parent, *newparent],
            _ => Vec::new(),
        }
    }

    /// Rename flags of a rename.
    pub fn rename_flags(noreplace: bool, exchange: bool) -> RenameFlags {
        RenameFlags { noreplace, exchange }
    }

    /// The xattr mode byte as the engine's enum.
    pub fn xattr_mode(mode: u8) -> XattrMode {
        match mode {
            1 => XattrMode::Create,
            2 => XattrMode::Replace,
            _ => XattrMode::Any,
        }
    }
}

/// Replies to [`Op`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum OpReply {
    /// Done; nothing to return.
    Done,
    /// Done; the inode's new attributes.
    Attr(Attr),
    /// Done; the first of the stripe versions handed out.
    Versions(u64),
    /// The reply, with a shard capability for its file (to a caller with a client
    /// key that created the file or reserved versions of it; `shingle_transport::cap`).
    WithCap(Box<OpReply>, Vec<u8>),
    /// Done; a file made with stripe versions reserved ([`CreateReserve`]), still
    /// empty: its attributes and its layout policy (no stripes), so its creator opens
    /// it without reading it back. A retried create answered as done, or one that
    /// finds its file written meanwhile, gets [`OpReply::Attr`] and reads it.
    Made(Attr, Layout),
    /// Done at the coordinator's time `at` (an unlink or rmdir): the time its
    /// directory's modification and change times took, so a client that keeps the
    /// directory's attributes applies the change to them (protocol 12).
    DoneAt(TimeNs),
}
meta_rpc!(Op, 0x0401, OpReply);

/// Stripe records a [`ReadOp::GetInode`] reply carries: the first window of the
/// layout (4 GiB of a file of 4 MiB stripes). An open reads this much and no more.
pub const HEAD_STRIPES: u64 = 1024;

/// Most stripe records one [`ReadOp::Stripes`] reply carries.
pub const MAX_STRIPES_READ: u32 = 4096;

/// Most records one [`Fetch`] may name (a coordinator needs about eight).
pub const MAX_FETCH: usize = 64;

/// Most keys one [`Lock`] may name (an operation takes at most five).
pub const MAX_LOCK_KEYS: usize = 8;

/// Records a coordinator reads, from the primary of their partitions.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fetch {
    /// The caller's map epoch.
    pub epoch: Epoch,
    /// Inodes.
    pub inodes: Vec<Ino>,
    /// Entries.
    pub dentries: Vec<(Ino, Vec<u8>)>,
    /// Stripe records: (file, stripe index).
    pub stripes: Vec<(Ino, u64)>,
}

/// Reply to [`Fetch`], in request order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fetched {
    /// Inodes.
    pub inodes: Vec<Option<InodeRec>>,
    /// Entries.
    pub dentries: Vec<Option<DentryVal>>,
    /// Stripe records.
    pub stripes: Vec<Option<StripeRec>>,
}
meta_rpc!(Fetch, 0x0402, Fetched);

impl Fetch {
    /// The same records in requests of at most `most` records each.
    pub fn split(self, most: usize) -> Vec<Fetch> {
        let most = most.max(1);
        let mut out: Vec<Fetch> = Vec::new();
        let mut cur = Fetch {
            epoch: self.epoch,
            ..Fetch::default()
        };
        let full = |f: &Fetch| f.inodes.len() + f.dentries.len() + f.stripes.len() >= most;
        let next = |cur: &mut Fetch, out: &mut Vec<Fetch>| {
            if full(cur) {
                let epoch = cur.epoch;
                out.push(std::mem::replace(
                    cur,
                    Fetch {
                        epoch,
                        ..Fetch::default()
                    },
                ));
            }
        };
        for i in self.inodes {
            next(&mut cur, &mut out);
            cur.inodes.push(i);
        }
        for d in self.dentries {
            next(&mut cur, &mut out);
            cur.dentries.push(d);
        }
        for st in self.stripes {
            next(&mut cur, &mut out);
            cur.stripes.push(st);
        }
        out.push(cur);
        out
    }
}

/// One change to a partition, as replicated.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PartOp {
    /// Step `step` of `intent` (0: none).
    Apply {
        /// Intent id or 0.
        intent: u64,
        /// Step number.
        step: u16,
        /// The change.
        m: Mutation,
    },
    /// Records an intent.
    Begin(Intent),
    /// Drops a finished intent.
    Finish(u64),
    /// Forgets an intent's at-most-once markers.
    Forget(u64),
    /// Raises the counter high-water mark.
    Counter(u64),
}

/// A batch for a partition, sent to its primary, which numbers and replicates it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Execute {
    /// The caller's map epoch.
    pub epoch: Epoch,
    /// The coordinating node. The primary refuses the batch when that node is not Up,
    /// or when a step of an intent (or the intent's record) comes from another node
    /// than the primary of the intent's partition (fencing: a coordinator that lost
    /// its partition cannot go on applying steps the new primary redoes).
    pub from: NodeId,
    /// Partition.
    pub partition: PartitionId,
    /// Changes, applied atomically and in order.
    pub ops: Vec<PartOp>,
}
meta_rpc!(Execute, 0x0403, ());

/// Allocates counters (inode numbers, intent ids) of a partition.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Alloc {
    /// The caller's map epoch.
    pub epoch: Epoch,
    /// Partition.
    pub partition: PartitionId,
}
meta_rpc!(Alloc, 0x0404, u64);

/// Takes (or releases) inode locks at their host (the primary of each inode's partition).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lock {
    /// Keys (inode numbers; 0 is the rename lock of directories moving between directories).
    pub keys: Vec<u64>,
    /// The operation holding them.
    pub owner: u64,
    /// Lease: held keys free themselves after this long.
    pub lease_ms: u32,
    /// How long to wait for busy keys before answering `false` (0 releases instead).
    pub wait_ms: u32,
    /// True to release.
    pub release: bool,
    /// The partition of the operation's intent, if it makes one (its anchor): when the
    /// coordinator's node goes Down, the host frees the keys as soon as that
    /// partition's new primary has redone what the coordinator left ([`Settled`]).
    pub anchor: PartitionId,
    /// Records to read once the keys are held: the coordinator's next [`Fetch`] (the
    /// locked inodes), saved a round trip. Read as a `Fetch` is, so only for a caller
    /// on this node's map epoch.
    pub fetch: Option<Fetch>,
}
meta_rpc!(Lock, 0x0405, Locked);

/// Reply to [`Lock`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Locked {
    /// Whether the keys are held (a release: always).
    pub granted: bool,
    /// What [`Lock::fetch`] read once they were; `None` when not asked, not granted,
    /// or refused (another map epoch): the coordinator then fetches as before.
    pub fetched: Option<Fetched>,
}

/// Asks a partition's primary whether every operation left unfinished in it by an
/// earlier primary has been redone: it serves the partition and every intent pending
/// in it is one it drives itself. A lock host asks before it frees the keys of a
/// coordinator that went Down.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settled {
    /// The caller's map epoch.
    pub epoch: Epoch,
    /// Partition.
    pub partition: PartitionId,
}
meta_rpc!(Settled, 0x040D, bool);

/// A coordinator tells a directory's primary what an operation's intent will add to
/// the directory after the operation's answer (`coordinator::answer_before`), before it
/// answers: a settled read of the directory ([`ReadOp::GetAttrSettled`]) then counts it
/// without waiting for the step. The primary keeps it in memory until the step applies
/// there (or [`EXPECT_TTL`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Expect {
    /// The caller's map epoch.
    pub epoch: Epoch,
    /// The intent.
    pub intent: u64,
    /// The step of the intent that adjusts the directory.
    pub step: u16,
    /// The directory.
    pub dir: Ino,
    /// Change of its entry count.
    pub entries: i64,
    /// Change of its subdirectory count.
    pub subdirs: i64,
    /// Its new mtime and ctime.
    pub time: crate::namespace::types::TimeNs,
}
meta_rpc!(Expect, 0x040F, ());

/// Asks a node whether, in the partitions it leads, an operation may still have
/// counts to apply to any of `dirs`: a pending intent that adjusts one of them and is
/// not known here to be applied (`coordinator::quiet_dirs`, decision 0029).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quiet {
    /// The caller's map epoch: the answer is for the partitions this node leads in it.
    pub epoch: Epoch,
    /// The directories.
    pub dirs: Vec<Ino>,
}
meta_rpc!(Quiet, 0x0410, QuietReply);

/// Reply to [`Quiet`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuietReply {
    /// The partitions this node serves as primary: the answer covers them.
    pub partitions: Vec<PartitionId>,
    /// False when one of them holds a pending intent that may still adjust `dirs`.
    pub quiet: bool,
}

/// How long a directory's primary counts an [`Expect`] whose step has not applied.
pub const EXPECT_TTL: std::time::Duration = std::time::Duration::from_secs(5);

/// A numbered batch from the primary to a replica.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replicate {
    /// The primary's map epoch (fencing).
    pub epoch: Epoch,
    /// Partition.
    pub partition: PartitionId,
    /// The epoch whose primary produced the copy this batch follows.
    pub state_epoch: Epoch,
    /// Batch number (the replica must be at `lsn - 1`).
    pub lsn: u64,
    /// Changes.
    pub ops: Vec<PartOp>,
}

/// A replica's answer to [`Replicate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReplicaAck {
    /// Durable here.
    Done,
    /// Missed batches or follows another copy: install the primary's copy first.
    NeedInstall,
}
meta_rpc!(Replicate, 0x0406, ReplicaAck);

/// A piece of the primary's copy of a partition, for a member that must catch up (see
/// [`super::copy`]). Answered with the bytes of that copy the member now holds: the
/// copy's `total` once it is installed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstallPiece {
    /// The sender's map epoch (fencing).
    pub epoch: Epoch,
    /// Partition.
    pub partition: PartitionId,
    /// Which copy.
    pub copy: CopyId,
    /// Where this piece starts in the encoded copy.
    pub offset: u64,
    /// The piece.
    pub data: Vec<u8>,
}
meta_rpc!(InstallPiece, 0x040B, u64);

/// A replica that has not caught up asks its primary for an install (in pieces).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncMe {
    /// The replica's map epoch.
    pub epoch: Epoch,
    /// Partition.
    pub partition: PartitionId,
    /// The replica.
    pub node: crate::ids::NodeId,
}
meta_rpc!(SyncMe, 0x0408, ());

/// A new primary asks the other members for the position of their copy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pull {
    /// The caller's map epoch.
    pub epoch: Epoch,
    /// Partition.
    pub partition: PartitionId,
}

/// A member's position.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pulled {
    /// The copy was complete (serving) when asked.
    pub serving: bool,
    /// State epoch.
    pub state_epoch: Epoch,
    /// Batch number.
    pub lsn: u64,
    /// Counter high-water mark.
    pub counter_hwm: u64,
    /// What the member knows of nodes that may still serve the partition without being
    /// members (the new primary fences them; [`super::read_fence`]).
    pub fence: super::read_fence::Knowledge,
}
meta_rpc!(Pull, 0x0409, Pulled);

/// A new primary asks the member with the best copy for the piece of it at `offset`
/// (see [`super::copy`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PullPiece {
    /// The caller's map epoch.
    pub epoch: Epoch,
    /// Partition.
    pub partition: PartitionId,
    /// Where in the encoded copy.
    pub offset: u64,
}

/// A piece of a member's copy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PulledPiece {
    /// Which copy (its position now: a copy that moved on starts over).
    pub copy: CopyId,
    /// Where this piece starts.
    pub offset: u64,
    /// The piece.
    pub data: Vec<u8>,
}
meta_rpc!(PullPiece, 0x040C, PulledPiece);

/// A primary asks a node a map dropped from one of its partitions whether it adopted
/// `epoch` (see [`super::read_fence`]): the node fetches the map if it is behind and
/// answers the epoch it adopted, from which on its dropped copies no longer serve.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fence {
    /// The caller's map epoch.
    pub epoch: Epoch,
}
meta_rpc!(Fence, 0x040E, Epoch);

/// Counts of a node, for statfs and `shingle status`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats;

/// Reply to [`Stats`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStats {
    /// Map epoch.
    pub epoch: Epoch,
    /// Inodes in the partitions this node is primary of.
    pub inodes: u64,
    /// Partitions held.
    pub partitions: u32,
    /// Of which serving (caught up).
    pub serving: u32,
    /// Of which primary.
    pub primary: u32,
    /// The data repair scan over those partitions' files.
    pub repair: RepairStats,
}
meta_rpc!(Stats, 0x040A, NodeStats);

/// Progress of a node's repair scan (rebuild of shards on lost nodes, completion of
/// stripes written degraded), over the files of the partitions it is primary of.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepairStats {
    /// Passes completed.
    pub passes: u64,
    /// A pass is running.
    pub running: bool,
    /// Shards found needing repair at the start of the current (or last) pass.
    pub todo: u64,
    /// Of which repaired so far in this pass.
    pub done: u64,
    /// Of which failed in this pass (retried next pass).
    pub failed: u64,
    /// Shards repaired since start.
    pub repaired_total: u64,
    /// Bytes rebuilt since start.
    pub bytes_total: u64,
    /// Rebuild rate of the current (or last) pass, bytes per second.
    pub bytes_per_sec: u64,
    /// Stripes that cannot be read now (fewer than k shards on Up nodes).
    pub unreadable: u64,
    /// Map epoch the current (or last) pass planned with.
    pub map_epoch: u64,
    /// Shards to move to their placement group's current node (rebalance after a node
    /// joined or returned), found at the start of the current (or last) pass.
    pub moves_todo: u64,
    /// Of which moved so far in this pass.
    pub moved: u64,
    /// Shards moved since start.
    pub moved_total: u64,
    /// Stripes with two or more shards on one node at the start of the current (or
    /// last) pass: written while their group had too few live nodes, they survive one
    /// node loss fewer than their policy promises until repair spreads them.
    pub shared: u64,
}

/// Encodes a message.
pub fn encode<T: Serialize>(v: &T) -> Result<Bytes, Status> {
    postcard::to_stdvec(v)
        .map(Bytes::from)
        .map_err(|e| Status::new(Code::Internal, format!("cannot encode: {e}")))
}

/// Decodes a message.
pub fn decode<T: DeserializeOwned>(b: &[u8]) -> Result<T, Status> {
    postcard::from_bytes(b).map_err(|e| Status::new(Code::InvalidRequest, format!("cannot decode: {e}")))
}

/// A namespace errno as an error reply.
pub fn errno_status(e: Errno) -> Status {
    Status::application(e.code() as u32, e.to_string())
}

/// Why a call to the namespace service failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The operation failed with a POSIX error.
    #[error("{0}")]
    Errno(Errno),
    /// The peer's map differs from ours (or it is not the primary we thought).
    #[error("stale map at {0}")]
    Stale(SocketAddr),
    /// Transport failure (peer down, timeout, protocol error).
    #[error(transparent)]
    Transport(TransportError),
}

impl CallError {
    /// The errno a client should see if it gives up now.
    pub fn errno(&self) -> Errno {
        match self {
            CallError::Errno(e) => *e,
            CallError::Stale(_) => Errno::EAGAIN,
            CallError::Transport(_) => Errno::EIO,
        }
    }

    /// Worth retrying (elsewhere, or after a map refresh)?
    pub fn retryable(&self) -> bool {
        match self {
            CallError::Errno(e) => *e == Errno::EAGAIN,
            CallError::Stale(_) => true,
            CallError::Transport(t) => {
                t.is_peer_failure()
                    || matches!(
                        t.status().map(|s| s.code),
                        Some(Code::ShuttingDown | Code::Overloaded | Code::DeadlineExceeded | Code::UnknownKind)
                    )
            }
        }
    }
}

/// Sends `req` to `peer` and decodes the reply.
pub async fn call<C: RpcChannel, R: MetaRpc>(
    client: &C,
    peer: SocketAddr,
    req: &R,
    timeout: std::time::Duration,
) -> Result<R::Reply, CallError> {
    let payload = encode(req).map_err(|s| CallError::Transport(TransportError::Remote { peer, status: s }))?;
    shingle_transport::name_kind::<R>(R::KIND);
    match client
        .call_raw(peer, R::KIND, payload, CallOptions::timeout(timeout))
        .await
    {
        Ok(b) => decode(&b).map_err(|s| {
            CallError::Transport(TransportError::Decode {
                peer,
                message: s.message,
            })
        }),
        Err(e) => Err(match e.status() {
            Some(s) if s.code == Code::Application => CallError::Errno(Errno::from_code(s.app_code as i32)),
            Some(s) if s.code == Code::StaleEpoch => CallError::Stale(peer),
            // A client key that may not: EROFS when the server says so (read only).
            Some(s) if s.code == Code::PermissionDenied => CallError::Errno(match s.app_code {
                0 => Errno::EACCES,
                c => Errno::from_code(c as i32),
            }),
            _ => CallError::Transport(e),
        }),
    }
}
