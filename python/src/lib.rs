//! # shingle-python
//!
//! The extension module `shingle._native` of the Python package in `python/shingle`:
//! the Rust client (`shingle-client`) embedded in the Python process, so training code
//! reads and writes a cluster without FUSE and without kernel copies.
//!
//! - [`session`]: one connection to a cluster (its own tokio runtime), path
//!   resolution with symlinks and permission checks done as the kernel does for a
//!   mount, namespace calls, and the prefetch cache.
//! - [`file`]: an open file: `read`, `readinto` any writable buffer, `pread`,
//!   `write`, `seek`, `flush` (the commit: durable when it returns), `close`.
//! - [`buffer`]: a read-only buffer over the client's own bytes (`read_buffer`,
//!   `read_file`): `numpy.frombuffer` and `memoryview` see them without a copy.
//!
//! The Python layer (`python/shingle/*.py`) builds the public API on these: `Client`,
//! `os`-style functions, `os.stat_result`s, a reconnect after `fork`, the fsspec
//! filesystem and the dataset helper. Every call releases the GIL while it waits on
//! the cluster. Errors are `OSError`s with the errno the filesystem answered, so
//! Python raises `FileNotFoundError`, `PermissionError` and friends.

pub mod buffer;
pub mod file;
pub mod session;

use pyo3::prelude::*;
use shingle_meta::namespace::Errno;

/// The `OSError` for `e` (Python picks the subclass from the errno), naming `path`.
pub(crate) fn os_error(e: Errno, path: &[u8]) -> PyErr {
    let code = e.code();
    let msg = std::io::Error::from_raw_os_error(code).to_string();
    let msg = match msg.find(" (os error") {
        Some(i) => msg[..i].to_string(),
        None => msg,
    };
    let path = String::from_utf8_lossy(path).into_owned();
    pyo3::exceptions::PyOSError::new_err((code, msg, path))
}

/// Fails when an object made in one process is used in another (after `fork`): its
/// runtime's threads do not exist there. The Python layer connects again instead.
pub(crate) fn same_process(pid: u32) -> PyResult<()> {
    if pid == std::process::id() {
        Ok(())
    } else {
        Err(pyo3::exceptions::PyRuntimeError::new_err(
            "this Shingle object was made in another process (before a fork): connect again in this one",
        ))
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<session::Session>()?;
    m.add_class::<file::File>()?;
    m.add_class::<buffer::Buffer>()?;
    Ok(())
}
