//! Socket plumbing shared by both ends of a connection: the writer task and the
//! bounded reads of headers and payloads.

use crate::frame::{FrameError, FrameHeader, HEADER_LEN};
use bytes::{BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// One frame queued for the writer task: encoded header and payload.
pub(crate) struct Outgoing {
    pub header: [u8; HEADER_LEN],
    pub payload: Bytes,
}

impl Outgoing {
    /// Encodes `header` for `payload`.
    pub fn new(header: &FrameHeader, payload: Bytes) -> Result<Self, FrameError> {
        Ok(Outgoing {
            header: header.encode(&payload)?,
            payload,
        })
    }
}

const WRITE_BUFFER: usize = 64 << 10;

/// Writes queued frames until the queue closes or `cancel` fires, coalescing whatever
/// is queued into one flush. Returns the I/O error that ended it, if any.
pub(crate) async fn writer_loop<W: AsyncWrite + Unpin>(
    w: W,
    mut rx: mpsc::Receiver<Outgoing>,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    let mut w = BufWriter::with_capacity(WRITE_BUFFER, w);
    loop {
        let first = tokio::select! {
            m = rx.recv() => m,
            _ = cancel.cancelled() => None,
        };
        let Some(mut msg) = first else { break };
        loop {
            w.write_all(&msg.header).await?;
            w.write_all(&msg.payload).await?;
            match rx.try_recv() {
                Ok(next) => msg = next,
                Err(_) => break,
            }
        }
        w.flush().await?;
    }
    w.flush().await?;
    w.shutdown().await
}

/// Reads one raw header; `Ok(None)` on a clean end of stream before the first byte.
pub(crate) async fn read_header<R: AsyncRead + Unpin>(
    r: &mut R,
) -> std::io::Result<Option<[u8; HEADER_LEN]>> {
    let mut raw = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < HEADER_LEN {
        let n = r.read(&mut raw[got..]).await?;
        if n == 0 {
            if got == 0 {
                return Ok(None);
            }
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        got += n;
    }
    Ok(Some(raw))
}

/// Appends exactly `len` bytes from `r` to `buf` without zero-filling, returning the
/// running checksum continued from `crc`.
pub(crate) async fn read_payload_into<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut BytesMut,
    len: usize,
    mut crc: u32,
) -> std::io::Result<u32> {
    buf.reserve(len);
    let start = buf.len();
    let end = start + len;
    while buf.len() < end {
        let before = buf.len();
        let want = end - before;
        let n = r.read_buf(&mut (&mut *buf).limit(want)).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        crc = crc32c::crc32c_append(crc, &buf[before..before + n]);
    }
    debug_assert_eq!(buf.len(), start + len);
    Ok(crc)
}

/// Reads and drops `len` bytes (the payload of a reply nobody waits for any more).
pub(crate) async fn discard<R: AsyncRead + Unpin>(r: &mut R, len: usize) -> std::io::Result<()> {
    let mut left = len as u64;
    let mut sink = tokio::io::sink();
    let copied = tokio::io::copy(&mut (&mut *r).take(left), &mut sink).await?;
    left -= copied;
    if left > 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}
