//! An open file of a session.
//!
//! Reads go to the client's stripe cache and readahead; `readinto` copies from the
//! client's bytes straight into the caller's buffer (a numpy array, a bytearray, any
//! writable contiguous buffer) with the GIL released, and `read_buffer` hands out the
//! client's bytes themselves. Writes are buffered by the client to full stripes;
//! `flush` (and `close`) commits them: when it returns they are durable and another
//! client's next open sees them. A file whose content was prefetched is read from
//! memory and never opened on the cluster.

use crate::buffer::{Buffer, WritableView, with_bytes};
use crate::session::{Core, OpenMode, Opened, READ_CHUNK, StatTuple, read_range, release, stat_tuple};
use crate::{os_error, same_process};
use bytes::Bytes;
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use shingle_client::OpenFile;
use shingle_meta::namespace::{Attr, Errno, SetAttr};
use std::sync::Arc;

pyo3::import_exception!(io, UnsupportedOperation);

enum Content {
    Open(Arc<OpenFile>),
    Cached(Bytes),
}

/// An open file (`shingle._native.File`; Python code gets a `shingle.File`).
#[pyclass(module = "shingle._native")]
pub struct File {
    core: Option<Arc<Core>>,
    path: Vec<u8>,
    attr: Attr,
    content: Option<Content>,
    mode: OpenMode,
    pos: u64,
}

impl Drop for File {
    fn drop(&mut self) {
        // Unflushed writes of a file dropped without `close` stay in the client and are
        // committed by its next flush or lost with the process, as with a FUSE file
        // whose process died; the Python layer closes files it owns.
        if let Some(c) = &self.core
            && c.pid != std::process::id()
        {
            std::mem::forget(self.content.take());
        }
        release(self.core.take());
    }
}

impl File {
    pub fn new(core: Arc<Core>, path: Vec<u8>, opened: Opened, mode: OpenMode) -> File {
        let (attr, content) = match opened {
            Opened::File(a, f) => (a, Content::Open(f)),
            Opened::Cached(a, b) => (a, Content::Cached(b)),
        };
        File {
            core: Some(core),
            path,
            attr,
            content: Some(content),
            mode,
            pos: 0,
        }
    }

    fn live(&self) -> PyResult<(&Arc<Core>, &Content)> {
        match (&self.core, &self.content) {
            (Some(c), Some(f)) => {
                same_process(c.pid)?;
                Ok((c, f))
            }
            _ => Err(PyValueError::new_err("I/O operation on closed file")),
        }
    }

    /// The session and content of a file open for reading.
    fn readable(&self) -> PyResult<(&Arc<Core>, &Content)> {
        if !self.mode.read {
            return Err(UnsupportedOperation::new_err("not readable"));
        }
        self.live()
    }

    fn err(&self, e: Errno) -> PyErr {
        os_error(e, &self.path)
    }

    fn size(&self) -> PyResult<u64> {
        Ok(match self.live()?.1 {
            Content::Open(f) => f.size(),
            Content::Cached(b) => b.len() as u64,
        })
    }

    /// Up to `n` bytes at `offset` (to the end when `n` is negative), as the client's
    /// bytes when one read covers them.
    fn read_bytes(&self, py: Python<'_>, n: i64, offset: u64) -> PyResult<Bytes> {
        let (c, content) = self.readable()?;
        match content {
            Content::Cached(b) => {
                let from = (offset as usize).min(b.len());
                let to = if n < 0 {
                    b.len()
                } else {
                    from.saturating_add(n as usize).min(b.len())
                };
                Ok(b.slice(from..to))
            }
            Content::Open(f) => {
                let f = Arc::clone(f);
                let limit = u64::try_from(n).ok();
                c.block(py, async || read_range(&f, offset, limit).await)
                    .map_err(|e| self.err(e))
            }
        }
    }

    /// Reads into `view` from `offset`; returns the bytes read (fewer only at the end).
    fn read_into(&self, py: Python<'_>, view: &WritableView, offset: u64) -> PyResult<usize> {
        let (c, content) = self.readable()?;
        match content {
            Content::Cached(b) => {
                let from = (offset as usize).min(b.len());
                let n = (b.len() - from).min(view.len());
                view.fill(0, &b[from..from + n]);
                Ok(n)
            }
            Content::Open(f) => {
                let f = Arc::clone(f);
                let total = view.len();
                c.block(py, async || {
                    let mut done = 0usize;
                    while done < total {
                        let want = (total - done).min(READ_CHUNK as usize) as u32;
                        let b = f.read(offset + done as u64, want).await?;
                        if b.is_empty() {
                            break;
                        }
                        view.fill(done, &b);
                        done += b.len();
                    }
                    Ok(done)
                })
                .map_err(|e| self.err(e))
            }
        }
    }

    fn write_at(&self, py: Python<'_>, data: &Bound<'_, PyAny>, offset: Option<u64>) -> PyResult<usize> {
        if !self.mode.write {
            return Err(UnsupportedOperation::new_err("not writable"));
        }
        let (c, content) = self.live()?;
        let Content::Open(f) = content else {
            return Err(UnsupportedOperation::new_err("a prefetched file is read-only"));
        };
        let f = Arc::clone(f);
        with_bytes(data, |bytes| {
            c.block(py, async || {
                let mut at = offset.unwrap_or_else(|| f.size());
                let mut done = 0;
                while done < bytes.len() {
                    let end = (done + READ_CHUNK as usize).min(bytes.len());
                    let n = f.write(at, &bytes[done..end]).await? as usize;
                    done += n;
                    at += n as u64;
                }
                Ok(done)
            })
            .map_err(|e| self.err(e))
        })?
    }
}

#[pymethods]
impl File {
    /// Up to `n` bytes from the position (all that is left when `n` is negative).
    #[pyo3(signature = (n=-1))]
    fn read<'py>(&mut self, py: Python<'py>, n: i64) -> PyResult<Bound<'py, PyBytes>> {
        let b = self.read_bytes(py, n, self.pos)?;
        self.pos += b.len() as u64;
        Ok(PyBytes::new(py, &b))
    }

    /// Like `read`, as a read-only buffer over the client's bytes (no copy).
    #[pyo3(signature = (n=-1))]
    fn read_buffer(&mut self, py: Python<'_>, n: i64) -> PyResult<Buffer> {
        let b = self.read_bytes(py, n, self.pos)?;
        self.pos += b.len() as u64;
        Ok(Buffer::new(b))
    }

    /// Reads into any writable contiguous buffer; returns how many bytes.
    fn readinto(&mut self, py: Python<'_>, buf: &Bound<'_, PyAny>) -> PyResult<usize> {
        let view = WritableView::get(buf)?;
        let n = self.read_into(py, &view, self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }

    /// `n` bytes at `offset` (fewer at the end); the position does not move.
    fn pread<'py>(&self, py: Python<'py>, n: usize, offset: u64) -> PyResult<Bound<'py, PyBytes>> {
        let b = self.read_bytes(py, i64::try_from(n).unwrap_or(i64::MAX), offset)?;
        Ok(PyBytes::new(py, &b))
    }

    /// `readinto` at `offset`; the position does not move.
    fn preadinto(&self, py: Python<'_>, buf: &Bound<'_, PyAny>, offset: u64) -> PyResult<usize> {
        let view = WritableView::get(buf)?;
        self.read_into(py, &view, offset)
    }

    /// Writes any bytes-like object at the position (at the end in append mode).
    fn write(&mut self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<usize> {
        let at = if self.mode.append { None } else { Some(self.pos) };
        let n = self.write_at(py, data, at)?;
        self.pos = match at {
            Some(p) => p + n as u64,
            None => self.size()?,
        };
        Ok(n)
    }

    /// Writes at `offset`; the position does not move.
    fn pwrite(&self, py: Python<'_>, data: &Bound<'_, PyAny>, offset: u64) -> PyResult<usize> {
        self.write_at(py, data, Some(offset))
    }

    /// Moves the position (`whence` 0: from the start, 1: from here, 2: from the end).
    #[pyo3(signature = (offset, whence=0))]
    fn seek(&mut self, offset: i64, whence: i32) -> PyResult<u64> {
        let base = match whence {
            0 => 0,
            1 => self.pos as i64,
            2 => self.size()? as i64,
            _ => return Err(PyValueError::new_err(format!("invalid whence ({whence})"))),
        };
        let to = base
            .checked_add(offset)
            .filter(|t| *t >= 0)
            .ok_or_else(|| PyOSError::new_err((libc_einval(), "Invalid argument")))?;
        self.pos = to as u64;
        Ok(self.pos)
    }

    /// The position.
    fn tell(&self) -> PyResult<u64> {
        self.live()?;
        Ok(self.pos)
    }

    /// The file's size now (including what this client wrote and has not committed).
    #[getter(size)]
    fn get_size(&self) -> PyResult<u64> {
        self.size()
    }

    /// Attributes as of the open.
    #[getter]
    fn attr(&self) -> StatTuple {
        stat_tuple(&self.attr)
    }

    /// Cuts or extends the file to `size` (committing what was written first).
    fn truncate(&mut self, py: Python<'_>, size: u64) -> PyResult<u64> {
        if !self.mode.write {
            return Err(UnsupportedOperation::new_err("not writable"));
        }
        let (c, content) = self.live()?;
        let Content::Open(f) = content else {
            return Err(UnsupportedOperation::new_err("a prefetched file is read-only"));
        };
        let (f, ino) = (Arc::clone(f), self.attr.ino);
        c.block(py, async || {
            f.flush().await?;
            let set = SetAttr {
                size: Some(size),
                ..Default::default()
            };
            c.client.setattr(&c.creds, ino, set).await
        })
        .map_err(|e| self.err(e))?;
        Ok(size)
    }

    /// Commits what was written: durable on the cluster when this returns.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let (c, content) = self.live()?;
        if let Content::Open(f) = content
            && self.mode.write
        {
            let f = Arc::clone(f);
            c.block(py, async || f.flush().await).map_err(|e| self.err(e))?;
        }
        Ok(())
    }

    /// Commits and closes (a second close does nothing).
    fn close(&mut self, py: Python<'_>) -> PyResult<()> {
        if self.content.is_none() {
            return Ok(());
        }
        let r = self.flush(py);
        self.content = None;
        release(self.core.take());
        match r {
            // An unlinked file has nothing left to commit to.
            Err(e)
                if e.is_instance_of::<PyOSError>(py)
                    && e.value(py).getattr("errno")?.extract::<i32>()? == Errno::ENOENT.code() =>
            {
                Ok(())
            }
            r => r,
        }
    }

    /// Whether `close` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.content.is_none()
    }
}

fn libc_einval() -> i32 {
    Errno::EINVAL.code()
}
