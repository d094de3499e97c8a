//! Client side of erasure-coded stripes: encode and write the k+m shards of a stripe
//! to the nodes of its placement group in parallel, and read a stripe back from its
//! data shards, decoding from parity when a shard is missing, unreachable or corrupt.

use crate::ec::{EcError, EcPolicy};
use crate::service::{ShardId, ShardReadError, read_shard, write_shard};
use bytes::Bytes;
use shingle_transport::{RemoteRead, RpcChannel, TransportError};
use std::net::SocketAddr;
use tokio::task::JoinSet;

/// Why a stripe operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StripeError {
    /// The placement group does not have one node per shard.
    #[error("stripe needs {need} nodes, placement group has {have}")]
    WrongGroupSize {
        /// k + m.
        need: usize,
        /// Nodes given.
        have: usize,
    },
    /// Erasure coding failed (for example fewer than k shards readable).
    #[error(transparent)]
    Ec(#[from] EcError),
    /// Some shards could not be written; the stripe is not durable as a whole.
    #[error("stripe {stripe} of inode {ino}: {failed} of {total} shard writes failed (first: {first})")]
    WriteFailed {
        /// Inode.
        ino: u64,
        /// Stripe.
        stripe: u64,
        /// Failed shard writes.
        failed: usize,
        /// All shard writes.
        total: usize,
        /// The first error.
        first: String,
    },
}

/// Outcome of a stripe read.
#[derive(Debug)]
pub struct StripeRead {
    /// The stripe's data bytes.
    pub data: Bytes,
    /// Shards that failed (index and reason); non-empty means the read was degraded.
    pub failed: Vec<(usize, String)>,
}

/// Encodes `data` (at most one stripe) and writes shard i to `nodes[i]`, all in
/// parallel; returns when every shard is durable on its node.
pub async fn write_stripe<C>(
    client: &C,
    policy: EcPolicy,
    nodes: &[SocketAddr],
    ino: u64,
    stripe: u64,
    version: u64,
    data: Bytes,
) -> Result<(), StripeError>
where
    C: RpcChannel + Clone + Send + Sync + 'static,
{
    let n = usize::from(policy.k) + usize::from(policy.m);
    if nodes.len() != n {
        return Err(StripeError::WrongGroupSize {
            need: n,
            have: nodes.len(),
        });
    }
    let shards = policy.encode_stripe_bytes(data)?;
    let mut set = JoinSet::new();
    for (i, shard) in shards.into_iter().enumerate() {
        if i < usize::from(policy.k) && shard.is_empty() {
            // An empty data shard of a short stripe is not stored; readers know it is empty.
            continue;
        }
        let (c, node) = (client.clone(), nodes[i]);
        let id = ShardId {
            ino,
            stripe,
            shard: i as u32,
        };
        set.spawn(async move { write_shard(&c, node, id, version, shard).await.map(|_| ()) });
    }
    let mut errors: Vec<TransportError> = Vec::new();
    while let Some(r) = set.join_next().await {
        match r {
            Ok(Ok(())) => {}
            Ok(Err(e)) => errors.push(e),
            Err(e) => {
                return Err(StripeError::WriteFailed {
                    ino,
                    stripe,
                    failed: 1,
                    total: n,
                    first: e.to_string(),
                });
            }
        }
    }
    if let Some(first) = errors.first() {
        return Err(StripeError::WriteFailed {
            ino,
            stripe,
            failed: errors.len(),
            total: n,
            first: first.to_string(),
        });
    }
    Ok(())
}

/// Reads a stripe of `stripe_len` data bytes: the k data shards in parallel, and
/// parity shards only for data shards that fail (missing, unreachable, corrupt).
pub async fn read_stripe<C>(
    client: &C,
    policy: EcPolicy,
    nodes: &[SocketAddr],
    ino: u64,
    stripe: u64,
    version: u64,
    stripe_len: usize,
) -> Result<StripeRead, StripeError>
where
    C: RpcChannel + RemoteRead + Clone + Send + Sync + 'static,
{
    let (k, m) = (usize::from(policy.k), usize::from(policy.m));
    if nodes.len() != k + m {
        return Err(StripeError::WrongGroupSize {
            need: k + m,
            have: nodes.len(),
        });
    }
    let mut shards: Vec<Option<Bytes>> = vec![None; k + m];
    let mut failed = Vec::new();
    let fetch = |set: &mut JoinSet<(usize, Result<Bytes, ShardReadError>)>, i: usize| {
        let (c, node) = (client.clone(), nodes[i]);
        let id = ShardId {
            ino,
            stripe,
            shard: i as u32,
        };
        set.spawn(async move { (i, read_shard(&c, node, id, version).await) });
    };
    let mut set = JoinSet::new();
    // A short stripe leaves its last data shards empty: nothing to fetch for them.
    let used = policy.data_shards_used(stripe_len);
    let mut have = 0;
    for i in 0..used {
        fetch(&mut set, i);
    }
    for s in shards.iter_mut().take(k).skip(used) {
        *s = Some(Bytes::new());
        have += 1;
    }
    let mut next_parity = k;
    while let Some(joined) = set.join_next().await {
        let Ok((i, r)) = joined else { continue };
        match r {
            Ok(b) => {
                shards[i] = Some(b);
                have += 1;
            }
            Err(e) => {
                failed.push((i, e.to_string()));
                if next_parity < k + m {
                    fetch(&mut set, next_parity);
                    next_parity += 1;
                }
            }
        }
        if have == k {
            break;
        }
    }
    set.abort_all();
    let data = policy.decode_stripe(stripe_len, &shards)?;
    Ok(StripeRead { data, failed })
}
