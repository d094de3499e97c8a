//! Socket plumbing shared by both ends of a connection: the writer task and the
//! bounded reads of headers and payloads.

use crate::frame::{FrameError, FrameHeader, HEADER_LEN};
use bytes::{BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// One frame queued for the writer task: encoded header and payload, and the share of
/// the server's byte budget it holds until it is written.
pub(crate) struct Outgoing {
    pub header: [u8; HEADER_LEN],
    pub payload: Bytes,
    pub hold: Vec<tokio::sync::OwnedSemaphorePermit>,
}

impl Outgoing {
    /// Encodes `header` for `payload`.
    pub fn new(header: &FrameHeader, payload: Bytes) -> Result<Self, FrameError> {
        Ok(Outgoing {
            header: header.encode(&payload)?,
            payload,
            hold: Vec::new(),
        })
    }
}

/// Frames are gathered into one buffer up to this size before a write.
const WRITE_BUFFER: usize = 64 << 10;
/// Payloads from this size on are not copied into the buffer but written straight
/// from their own memory (one vectored write with whatever is buffered).
const DIRECT_PAYLOAD: usize = 16 << 10;

/// Writes queued frames until the queue closes or `cancel` fires, coalescing whatever
/// is queued into as few writes as possible. Returns the I/O error that ended it.
pub(crate) async fn writer_loop<W: AsyncWrite + Unpin>(
    mut w: W,
    mut rx: mpsc::Receiver<Outgoing>,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    let mut buf: Vec<u8> = Vec::with_capacity(WRITE_BUFFER);
    loop {
        let first = tokio::select! {
            m = rx.recv() => m,
            _ = cancel.cancelled() => None,
        };
        let Some(mut msg) = first else { break };
        loop {
            buf.extend_from_slice(&msg.header);
            if msg.payload.len() < DIRECT_PAYLOAD {
                buf.extend_from_slice(&msg.payload);
            } else {
                write_all_two(&mut w, &buf, &msg.payload).await?;
                buf.clear();
            }
            if buf.len() >= WRITE_BUFFER {
                w.write_all(&buf).await?;
                buf.clear();
            }
            match rx.try_recv() {
                Ok(next) => msg = next,
                Err(_) => break,
            }
        }
        if !buf.is_empty() {
            w.write_all(&buf).await?;
            buf.clear();
        }
    }
    w.flush().await?;
    w.shutdown().await
}

/// Writes `a` then `b` with vectored writes (one syscall when the socket takes it all).
async fn write_all_two<W: AsyncWrite + Unpin>(w: &mut W, mut a: &[u8], mut b: &[u8]) -> std::io::Result<()> {
    while !a.is_empty() {
        let n = w
            .write_vectored(&[std::io::IoSlice::new(a), std::io::IoSlice::new(b)])
            .await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        if n < a.len() {
            a = &a[n..];
        } else {
            b = &b[n - a.len()..];
            a = &[];
        }
    }
    w.write_all(b).await
}

/// Reads one raw header; `Ok(None)` on a clean end of stream before the first byte.
pub(crate) async fn read_header<R: AsyncRead + Unpin>(r: &mut R) -> std::io::Result<Option<[u8; HEADER_LEN]>> {
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
/// running checksum continued from `crc` (unchanged when `checksummed` is false).
pub(crate) async fn read_payload_into<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut BytesMut,
    len: usize,
    mut crc: u32,
    checksummed: bool,
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
        if checksummed {
            crc = crc32c::crc32c_append(crc, &buf[before..before + n]);
        }
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
