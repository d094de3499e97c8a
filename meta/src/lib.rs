//! # shingle-meta
//!
//! Metadata of a Shingle cluster.
//!
//! - [`ids`]: newtypes for nodes, epochs, partitions, placement groups and inodes
//!   (an inode number embeds the partition that allocated it).
//! - [`map`]: the cluster map state machine (nodes, roles, failure domains, states,
//!   epoch) and the [`map::Placement`] derived from it.
//! - [`placement`]: rendezvous hashing with failure domains; the dentry → partition hash.
//! - [`mod@format`]: on-disk format versions of the metadata stores and the rule for them.
//! - [`manager`]: the manager role: the cluster map replicated by Raft (openraft), stored
//!   in redb, spoken over the transport; `GetMap`/`Propose` for everyone else.
//! - [`meta_client`]: `MetaClient`, what clients and tools call the namespace service
//!   with: reads to the least-loaded member, mutations to the anchor's primary, retries
//!   through map changes.
//! - [`service`]: the namespace service of meta nodes; its replication decisions are
//!   pure ([`service::protocol`]).
//! - [`sim`]: a deterministic simulator of replication over many nodes and faults.
//!
//! This crate knows nothing of FUSE or of chunk bytes. Its protocol cores are pure
//! state machines; the I/O shells around them are thin.

pub mod agent;
pub mod format;
pub mod ids;
pub mod manager;
pub mod map;
pub mod meta_client;
pub mod namespace;
pub mod pause;
pub mod placement;
pub mod service;
pub mod sim;
