//! Placeholder while the real backend is written.
