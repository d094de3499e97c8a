//! Read windows: where a server puts the bytes a client will fetch with one RDMA READ.
//!
//! A server gives each RDMA client connection a **window**: one buffer registered once,
//! remote-read only, in a protection domain of that connection's own. A request that
//! stages bytes for the client (a shard read) copies them into a free range of the
//! window and answers a [`Grant`] — address, rkey, length, token and the server's queue
//! pair — so the client reads them with one READ and no further request. The rkey is
//! valid only on that queue pair (another connection's queue pair lives in another
//! protection domain, and its READ fails with a remote access error), reaches only the
//! window (which only ever holds bytes staged for requests this connection was allowed
//! to make), and dies with the connection. The client hands grants back (a release
//! message before its next request) once read; an unreleased grant keeps its range
//! until the connection closes, so a client that never releases only fills its own
//! window, after which its reads are answered without a grant (and go over TCP).
//!
//! [`WindowAlloc`] is the pure core: ranges of `[0, capacity)` handed out next-fit and
//! given back in any order. It never hands out a range overlapping a live one, and
//! refuses only when no free gap is long enough. The RDMA side (feature `rdma`) holds
//! the memory and the registration around it.

use std::collections::{BTreeMap, HashMap};

/// Where granted bytes are and how to read them: answered with the request that staged
/// them, read with one RDMA READ on the connection that asked.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct Grant {
    /// Virtual address of the first byte, in the server's window.
    #[prost(uint64, tag = "1")]
    pub addr: u64,
    /// Remote key of the window's registration (valid on `qpn` only).
    #[prost(uint32, tag = "2")]
    pub rkey: u32,
    /// Bytes granted.
    #[prost(uint32, tag = "3")]
    pub len: u32,
    /// What the client hands back once it has read them.
    #[prost(uint64, tag = "4")]
    pub token: u64,
    /// The server's queue pair the grant belongs to: a client whose queue pair to that
    /// server is another one (it reconnected) reads over TCP instead.
    #[prost(uint32, tag = "5")]
    pub qpn: u32,
}

/// Grants handed back by a client (the payload of the release message).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Release {
    /// Tokens of grants read (or given up).
    #[prost(uint64, repeated, tag = "1")]
    pub tokens: Vec<u64>,
}

/// Something that can place bytes in a connection's window (the server side of an RDMA
/// connection); handlers reach it through [`crate::CallContext::window`].
pub trait Window: Send + Sync + std::fmt::Debug {
    /// Copies `bytes` into a free range of the window and grants it; `None` when the
    /// window has no free range that long (the caller answers without a grant).
    fn place(&self, bytes: &[u8]) -> Option<Grant>;
}

/// The ranges of one window: which are granted, to which token.
#[derive(Debug, Clone)]
pub struct WindowAlloc {
    capacity: u32,
    /// Where the next search starts (after the last grant): next fit.
    cursor: u32,
    /// Live grants by offset: (length, token).
    live: BTreeMap<u32, (u32, u64)>,
    /// Offset of each live token.
    tokens: HashMap<u64, u32>,
    used: u64,
}

impl WindowAlloc {
    /// An empty window of `capacity` bytes.
    pub fn new(capacity: u32) -> WindowAlloc {
        WindowAlloc {
            capacity,
            cursor: 0,
            live: BTreeMap::new(),
            tokens: HashMap::new(),
            used: 0,
        }
    }

    /// Bytes of the window.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Bytes granted and not yet released.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Grants live now.
    pub fn grants(&self) -> usize {
        self.live.len()
    }

    /// A free range of `len` bytes (the first long enough gap at or after the cursor,
    /// else from the start), granted to `token`: its offset. `None` for an empty
    /// request, a token already live, or when no gap is long enough.
    ///
    /// The caller picks tokens no client can guess (random): a range may then be
    /// handed back only by the client the grant was answered to, after it was filled.
    pub fn place(&mut self, len: u32, token: u64) -> Option<u32> {
        if len == 0 || len > self.capacity || self.tokens.contains_key(&token) {
            return None;
        }
        let at = self.fit_from(self.cursor, len).or_else(|| self.fit_from(0, len))?;
        self.live.insert(at, (len, token));
        self.tokens.insert(token, at);
        self.used += u64::from(len);
        self.cursor = at + len;
        Some(at)
    }

    /// Hands a grant back; false for a token not live (already released, never granted).
    pub fn release(&mut self, token: u64) -> bool {
        let Some(at) = self.tokens.remove(&token) else {
            return false;
        };
        if let Some((len, _)) = self.live.remove(&at) {
            self.used -= u64::from(len);
        }
        true
    }

    /// The first start at or after `from` where `len` bytes fit between live grants.
    fn fit_from(&self, from: u32, len: u32) -> Option<u32> {
        // A grant covering `from` pushes the start to its end.
        let mut start = match self.live.range(..=from).next_back() {
            Some((&o, &(l, _))) if o + l > from => o + l,
            _ => from,
        };
        for (&o, &(l, _)) in self.live.range(start..) {
            if o >= start && o - start >= len {
                break;
            }
            start = start.max(o + l);
        }
        (u64::from(start) + u64::from(len) <= u64::from(self.capacity)).then_some(start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shingle_testkit::Rng;

    #[test]
    fn grants_fit_next_and_come_back_in_any_order() {
        let mut w = WindowAlloc::new(100);
        assert_eq!(w.place(40, 7), Some(0));
        assert_eq!(w.place(40, 7), None, "a live token is not granted twice");
        assert_eq!(w.place(40, 8), Some(40));
        assert_eq!(w.place(30, 9), None, "20 bytes left");
        assert!(w.release(7));
        assert!(!w.release(7), "twice");
        assert!(!w.release(999), "never granted");
        assert_eq!(w.place(30, 9), Some(0), "wraps to the freed start");
        assert!(w.release(8));
        assert_eq!(w.place(70, 10), Some(30), "after the cursor");
        assert_eq!(w.used(), 100);
        assert_eq!(w.place(0, 11), None);
        assert_eq!(WindowAlloc::new(10).place(11, 1), None);
    }

    /// The reference: a byte map of the window. Every grant must be in bounds and
    /// overlap no live one; a refusal is right only when no free run is long enough;
    /// release answers true exactly for live tokens.
    #[test]
    fn matches_a_byte_map_over_thousands_of_seeds() {
        for seed in 0..3000u64 {
            let mut rng = Rng::seeded(seed);
            let capacity = 1 + rng.below(256) as u32;
            let mut w = WindowAlloc::new(capacity);
            let mut owner: Vec<u64> = vec![0; capacity as usize];
            let mut live: Vec<(u64, u32, u32)> = Vec::new();
            for step in 0..200 {
                if rng.below(3) == 0 && !live.is_empty() || rng.below(10) == 0 {
                    // Release a live grant, or a token that is not live.
                    let bogus = live.is_empty() || rng.below(5) == 0;
                    let token = if bogus {
                        1 + rng.below(40)
                    } else {
                        live[rng.below(live.len() as u64) as usize].0
                    };
                    let expect = live.iter().position(|g| g.0 == token);
                    assert_eq!(w.release(token), expect.is_some(), "seed {seed} step {step}");
                    if let Some(i) = expect {
                        let (_, at, len) = live.swap_remove(i);
                        owner[at as usize..(at + len) as usize].fill(0);
                    }
                } else {
                    let len = rng.below(u64::from(capacity) / 2 + 2) as u32;
                    // Small tokens, so that some are live already and must be refused.
                    let token = 1 + rng.below(40);
                    let taken = live.iter().any(|g| g.0 == token);
                    match w.place(len, token) {
                        Some(at) => {
                            assert!(!taken, "seed {seed} step {step}: token {token} granted twice");
                            assert!(len > 0 && at + len <= capacity, "seed {seed} step {step}: bounds");
                            let r = &mut owner[at as usize..(at + len) as usize];
                            assert!(r.iter().all(|o| *o == 0), "seed {seed} step {step}: overlap");
                            r.fill(token);
                            live.push((token, at, len));
                        }
                        None => {
                            let longest = owner.split(|o| *o != 0).map(<[u64]>::len).max().unwrap_or(0);
                            assert!(
                                taken || len == 0 || (longest as u32) < len,
                                "seed {seed} step {step}: refused {len} with a free run of {longest}"
                            );
                        }
                    }
                }
                let used: u64 = live.iter().map(|g| u64::from(g.2)).sum();
                assert_eq!(w.used(), used, "seed {seed} step {step}");
                assert_eq!(w.grants(), live.len());
            }
        }
    }
}
