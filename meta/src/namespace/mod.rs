//! The POSIX namespace: entries hashed to partitions by (parent, name), inodes owned by
//! the partition that allocated them, multi-partition operations made atomic by intents.
//!
//! - [`types`]: attributes, credentials, errno, name rules.
//! - [`acl`]: POSIX ACL attributes: their format, and the mode one stands for.
//! - [`perm`]: permission rules (owner/group/other, sticky, setgid, chmod/chown).
//! - [`partition`]: one partition's state and its mutations.
//! - [`engine`]: the operations (lookup, getattr, setattr, mknod/mkdir/symlink, link,
//!   unlink, rmdir, rename with NOREPLACE/EXCHANGE, readdir, xattrs) and crash recovery.

pub mod acl;
pub mod engine;
pub mod partition;
pub mod perm;
pub mod types;

pub use engine::{MAX_CREATE_RESERVE, Namespace, Need, Plan, RenameFlags, XattrMode};
pub use partition::{DONE_KEEP_NS, DentryVal, DoneOp, InodeRec, Intent, Mutation, PURGE_DELAY_NS, Partition, Purge};
pub use types::{
    Attr, Creds, DirEntry, Errno, FileKind, Layout, MAX_FILE_BYTES, NsResult, SetAttr, StripeRec, StripeWrite, TimeNs,
};
