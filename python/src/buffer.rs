//! Python's buffer protocol both ways: [`Buffer`] exports the client's bytes
//! read-only (no copy), [`WritableView`] writes into a caller's buffer, and
//! [`with_bytes`] reads any bytes-like object in place. The raw-pointer work of the
//! crate lives here, each use with the reason it is sound.
#![allow(unsafe_code)]

use bytes::Bytes;
use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::{PyBufferError, PyTypeError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::ffi::{c_int, c_void};

/// Read-only bytes owned by the client (`memoryview(buf)`, `numpy.frombuffer(buf)`,
/// `bytes(buf)`, `len(buf)`).
#[pyclass(module = "shingle._native", frozen)]
pub struct Buffer {
    data: Bytes,
}

impl Buffer {
    pub fn new(data: Bytes) -> Buffer {
        Buffer { data }
    }
}

#[pymethods]
impl Buffer {
    fn __len__(&self) -> usize {
        self.data.len()
    }

    fn __bytes__<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.data)
    }

    /// # Safety
    /// Called by Python with a valid `view` to fill. The exported pointer stays valid
    /// while the view exists: the view holds a reference to this object (`obj`), which
    /// is frozen and owns the bytes, and `Bytes` never moves its contents.
    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("no view to fill"));
        }
        if flags & ffi::PyBUF_WRITABLE == ffi::PyBUF_WRITABLE {
            return Err(PyBufferError::new_err("a Shingle buffer is read-only"));
        }
        let (ptr, len) = {
            let b = &slf.get().data;
            (b.as_ptr(), b.len())
        };
        // SAFETY: `view` is non-null and Python hands it to us to fill; every field a
        // consumer reads is set below. `format` points to a static C string.
        unsafe {
            (*view).obj = slf.into_any().into_ptr();
            (*view).buf = ptr as *mut c_void;
            (*view).len = len as isize;
            (*view).readonly = 1;
            (*view).itemsize = 1;
            (*view).format = if flags & ffi::PyBUF_FORMAT == ffi::PyBUF_FORMAT {
                c"B".as_ptr() as *mut _
            } else {
                std::ptr::null_mut()
            };
            (*view).ndim = 1;
            (*view).shape = if flags & ffi::PyBUF_ND == ffi::PyBUF_ND {
                &mut (*view).len
            } else {
                std::ptr::null_mut()
            };
            (*view).strides = if flags & ffi::PyBUF_STRIDES == ffi::PyBUF_STRIDES {
                &mut (*view).itemsize
            } else {
                std::ptr::null_mut()
            };
            (*view).suboffsets = std::ptr::null_mut();
            (*view).internal = std::ptr::null_mut();
        }
        Ok(())
    }

    /// # Safety
    /// Nothing was allocated for the view (the format string is static).
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}

/// A caller's writable, C-contiguous buffer, held exported while it is written (so it
/// cannot be freed or resized meanwhile, GIL or not).
pub struct WritableView {
    buf: PyUntypedBuffer,
    ptr: usize,
    len: usize,
}

impl WritableView {
    pub fn get(obj: &Bound<'_, PyAny>) -> PyResult<WritableView> {
        let buf = PyUntypedBuffer::get(obj)?;
        if buf.readonly() {
            return Err(PyTypeError::new_err("readinto needs a writable buffer"));
        }
        if !buf.is_c_contiguous() {
            return Err(PyBufferError::new_err("readinto needs a contiguous buffer"));
        }
        let (ptr, len) = (buf.buf_ptr() as usize, buf.len_bytes());
        Ok(WritableView { buf, ptr, len })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies `src` to byte `at` of the buffer (as much as fits).
    pub fn fill(&self, at: usize, src: &[u8]) {
        let n = src.len().min(self.len.saturating_sub(at));
        if n == 0 {
            return;
        }
        // SAFETY: `at + n <= len`, the buffer is writable and C-contiguous (checked in
        // `get`), and it stays exported by `self.buf` for as long as `self` lives, so
        // the memory is neither freed nor moved. `src` is the client's own memory and
        // cannot overlap it.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), (self.ptr as *mut u8).add(at), n);
        }
        let _ = &self.buf;
    }
}

/// Calls `f` with the bytes of any bytes-like object, in place.
pub fn with_bytes<T>(obj: &Bound<'_, PyAny>, f: impl FnOnce(&[u8]) -> T) -> PyResult<T> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(f(b.as_bytes()));
    }
    let buf = PyUntypedBuffer::get(obj)?;
    if !buf.is_c_contiguous() {
        return Err(PyBufferError::new_err("write needs a contiguous buffer"));
    }
    // SAFETY: the buffer is C-contiguous and `len_bytes` long, and `buf` keeps it
    // exported (alive, not resized) until it drops after `f` returns.
    let bytes = unsafe { std::slice::from_raw_parts(buf.buf_ptr() as *const u8, buf.len_bytes()) };
    let out = f(bytes);
    drop(buf);
    Ok(out)
}
