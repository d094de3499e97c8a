//! The calls a client of a data node makes: read a shard (whole or a byte range, by
//! `StageShard` and the remote-read verb, verified end to end) and write one.

use crate::wire::*;
use bytes::{Bytes, BytesMut};
use shingle_transport::{RemoteRead, RpcChannel, TransportError};
use std::net::SocketAddr;

/// Why a shard read failed on the client side.
#[derive(Debug, thiserror::Error)]
pub enum ShardReadError {
    /// Transport failure or error reply.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// The bytes read do not match the shard's checksum.
    #[error("shard {0:?} failed its checksum after transfer")]
    Checksum(ShardId),
}

impl ShardReadError {
    /// The errno the node answered with, if it answered.
    pub fn errno(&self) -> Option<u32> {
        match self {
            ShardReadError::Transport(e) => e
                .status()
                .filter(|s| s.code == shingle_transport::Code::Application)
                .map(|s| s.app_code),
            ShardReadError::Checksum(_) => None,
        }
    }
}

/// Reads one shard from `node`: stage, then read the staged bytes — from the grant the
/// node answered over RDMA (one READ), else by the staged region's key — then verify
/// the crc32c end to end. A staged copy evicted between the two steps is staged again
/// (bounded).
pub async fn read_shard<C: RpcChannel + RemoteRead>(
    client: &C,
    node: SocketAddr,
    id: ShardId,
    version: u64,
    cap: &Bytes,
) -> Result<Bytes, ShardReadError> {
    read_shard_range(client, node, id, version, 0, 0, cap).await
}

/// Reads `len` bytes at `offset` of one shard version from `node` (`len` 0: the whole
/// shard), verified end to end against the crc32c the node computed of that range.
/// `cap`: a shard capability for the file when this client holds a client key (empty
/// otherwise).
pub async fn read_shard_range<C: RpcChannel + RemoteRead>(
    client: &C,
    node: SocketAddr,
    id: ShardId,
    version: u64,
    offset: u64,
    len: u64,
    cap: &Bytes,
) -> Result<Bytes, ShardReadError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let inline = len > 0 && len <= INLINE_MAX;
        let req = StageShardRequest {
            id: Some(id),
            version,
            range_offset: offset,
            range_len: len,
            inline,
            cap: cap.clone(),
        };
        let r = client.call::<StageShard>(node, &req, Default::default()).await?;
        if inline && r.data.len() as u64 == len {
            if crc32c::crc32c(&r.data) != r.range_crc {
                return Err(ShardReadError::Checksum(id));
            }
            return Ok(r.data);
        }
        let (off, want) = if len == 0 { (0, r.region_len) } else { (offset, len) };
        // The buffer is sized from the answer: no shard is larger than a chunk payload.
        let want = u32::try_from(want)
            .ok()
            .filter(|w| *w <= crate::chunk::MAX_CHUNK_PAYLOAD)
            .ok_or(ShardReadError::Checksum(id))?;
        let buf = BytesMut::with_capacity(want as usize);
        // Placed for us over RDMA: one READ, no further request; else by the region key.
        let buf = match r.grant.filter(|g| g.len == want) {
            Some(g) => client.read_grant(node, &g, buf).await,
            None => Err(buf),
        };
        let read = match buf {
            Ok(got) => Ok(got),
            Err(buf) => {
                let (res, buf) = client.read_capped(node, r.key(), cap.clone(), off, want, buf).await;
                res.map(|()| buf)
            }
        };
        match read {
            Ok(buf) if crc32c::crc32c(&buf) == r.range_crc => return Ok(buf.freeze()),
            Ok(_) => return Err(ShardReadError::Checksum(id)),
            Err(TransportError::Access(_)) if attempt < 3 => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Writes one shard to `node` (with `cap`, a shard capability for its file, when this
/// client holds a client key); returns once it is durable there.
pub async fn write_shard<C: RpcChannel>(
    client: &C,
    node: SocketAddr,
    id: ShardId,
    version: u64,
    data: Bytes,
    cap: Bytes,
) -> Result<WriteShardResponse, TransportError> {
    let crc = crc32c::crc32c(&data);
    client
        .call::<WriteShard>(
            node,
            &WriteShardRequest {
                id: Some(id),
                version,
                crc,
                data,
                cap,
            },
            Default::default(),
        )
        .await
}
