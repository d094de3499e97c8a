//! What a client key may send to a node: the guard every node's server asks before a
//! client's request (issue 16; `docs/decisions/0020-client-keys.md`).
//!
//! Holders of the cluster secret (nodes, admin tools) may send anything. A client key
//! may send only what mounts and tools send, and only while the cluster map grants
//! it: reads with any grant, writes with a write grant. Everything the cluster's nodes
//! say to each other (replication, installs, locks, fences, Raft, proposals to the
//! managers, shard repair and file deletion) is refused to every client key. What a
//! request may do inside a kind it may send (root squashing) is its service's
//! business.

use shingle_data::wire::{DeleteShard, StageShard, Stat, WriteShard};
use shingle_meta::manager::rpc::{GetMap, Heartbeat, Report};
use shingle_meta::map::ClusterMap;
use shingle_meta::service::wire::{MetaRpc, Op, Read, Stats};
use shingle_transport::auth::Principal;
use shingle_transport::server::Guard;
use shingle_transport::{Code, MsgKind, Rpc, Status};
use std::sync::Arc;
use tokio::sync::watch;

/// What sending a kind takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Any live grant.
    Read,
    /// A write grant.
    Write,
}

/// What a client needs to send `kind`; `None` for kinds only the cluster's own nodes
/// send (and kinds nobody registered).
pub fn client_access(kind: MsgKind) -> Option<Access> {
    let read = [
        <Read as MetaRpc>::KIND,
        <Stats as MetaRpc>::KIND,
        <GetMap as Rpc>::KIND,
        <Heartbeat as Rpc>::KIND,
        <Report as Rpc>::KIND,
        <Stat as Rpc>::KIND,
        // Stages a shard's range for a remote read (or returns it inline).
        <StageShard as Rpc>::KIND,
    ];
    let write = [
        <Op as MetaRpc>::KIND,
        <WriteShard as Rpc>::KIND,
        <DeleteShard as Rpc>::KIND,
    ];
    if read.contains(&kind) {
        Some(Access::Read)
    } else if write.contains(&kind) {
        Some(Access::Write)
    } else {
        None
    }
}

/// Whether `principal` may send `kind` under `map`.
pub fn allowed(map: &ClusterMap, principal: &Principal, kind: MsgKind) -> Result<(), Status> {
    let Principal::Client(id) = principal else {
        return Ok(());
    };
    let denied = |why: String| Err(Status::new(Code::PermissionDenied, why));
    let Some(grant) = map.client(&id.name, id.serial) else {
        return denied(format!("client key {id} is revoked or was never granted"));
    };
    match client_access(kind) {
        Some(Access::Read) => Ok(()),
        Some(Access::Write) if grant.write => Ok(()),
        Some(Access::Write) => Err(Status {
            app_code: shingle_meta::namespace::Errno::EROFS.code() as u32,
            ..Status::new(Code::PermissionDenied, format!("client key {id} is read-only"))
        }),
        None => denied(format!("message kind {kind} is sent only by the cluster's own nodes")),
    }
}

/// The guard of a node whose current map `maps` holds.
pub fn guard(maps: watch::Receiver<Arc<ClusterMap>>) -> Guard {
    Arc::new(move |p: &Principal, kind: MsgKind| allowed(&maps.borrow(), p, kind))
}

#[cfg(test)]
mod tests {
    use super::*;
    use shingle_meta::map::MapCommand;
    use shingle_meta::service::wire::{Fence, Replicate};
    use shingle_transport::auth::Identity;

    #[test]
    fn clients_send_what_their_grant_allows_and_never_what_nodes_say() {
        let mut map = ClusterMap::new("c", 8, 8, 3, 6);
        for (name, write) in [("rw", true), ("ro", false)] {
            map.apply(&MapCommand::GrantClient {
                name: name.into(),
                write,
                root_squash: true,
                act_as: None,
                subtree: None,
            })
            .expect("grant");
        }
        let client = |name: &str, serial| Principal::Client(Identity::new(name, serial).expect("id"));
        let code_in = |map: &ClusterMap, p: &Principal, k: MsgKind| allowed(map, p, k).err().map(|s| s.code);
        let code = |p: &Principal, k: MsgKind| code_in(&map, p, k);
        let (op, read, repl) = (
            <Op as MetaRpc>::KIND,
            <Read as MetaRpc>::KIND,
            <Replicate as MetaRpc>::KIND,
        );
        for k in [op, read, repl, <Fence as MetaRpc>::KIND, <GetMap as Rpc>::KIND] {
            assert_eq!(code(&Principal::Cluster, k), None, "{k}");
        }
        assert_eq!(code(&client("rw", 1), op), None);
        assert_eq!(code(&client("rw", 1), <WriteShard as Rpc>::KIND), None);
        assert_eq!(code(&client("ro", 1), read), None);
        assert_eq!(code(&client("ro", 1), <StageShard as Rpc>::KIND), None, "shard reads");
        let denied = Some(Code::PermissionDenied);
        assert_eq!(code(&client("ro", 1), op), denied);
        let ro = allowed(&map, &client("ro", 1), op).expect_err("read-only");
        assert_eq!(ro.app_code, 30, "EROFS: {ro}");
        assert_eq!(code(&client("ro", 1), <WriteShard as Rpc>::KIND), denied);
        for k in [
            repl,
            <Fence as MetaRpc>::KIND,
            MsgKind(0x0300),
            MsgKind(0x0311),
            MsgKind(0x0206),
        ] {
            assert_eq!(code(&client("rw", 1), k), denied, "{k}");
        }
        assert_eq!(code(&client("rw", 2), read), denied, "a serial never granted");
        assert_eq!(code(&client("nobody", 1), read), denied);
        let mut map = map.clone();
        map.apply(&MapCommand::RevokeClient { name: "rw".into() })
            .expect("revoke");
        assert_eq!(code_in(&map, &client("rw", 1), read), denied, "revoked");
    }
}
