//! The aligned bounce buffer of `O_DIRECT` transfers.

use super::*;

/// A zero-initialised heap buffer whose start is aligned for `O_DIRECT`; freed on drop.
pub(super) struct AlignedBuf {
    pub(super) ptr: NonNull<u8>,
    pub(super) len: usize,
    pub(super) layout: Layout,
}

impl AlignedBuf {
    /// `len` bytes aligned to `align` (a power of two).
    #[allow(unsafe_code)]
    pub(super) fn zeroed(len: usize, align: usize) -> io::Result<Self> {
        let size = len.max(1).next_multiple_of(align.max(1));
        let layout = Layout::from_size_align(size, align)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("bounce buffer layout: {e}")))?;
        // SAFETY: `layout` has a non-zero size (at least 1, rounded up).
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout)
        };
        Ok(AlignedBuf { ptr, len, layout })
    }

    #[allow(unsafe_code)]
    pub(super) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` points to `layout.size() >= len` bytes allocated by `zeroed`, all
        // initialised (zeroed), owned by `self` and not freed before `self` is dropped; the
        // exclusive borrow of `self` makes this the only access meanwhile.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        // SAFETY: `ptr` was returned by `alloc_zeroed(self.layout)` and is freed only here.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}
