//! The content of one file open on one client, as a pure core: no I/O, no clock.
//!
//! A file's bytes live in three places: the **committed** layout (stripe versions the
//! metadata service holds), stripes **stored** on the data nodes under a new version
//! but not yet committed, and **dirty** stripes in this client's memory. [`Content`]
//! is the one place that knows, per stripe, which of them holds the truth, so reads,
//! read-modify-write, truncate, flush, fsync and close all agree:
//!
//! - [`Content::read_plan`] says where each byte of a range comes from (local bytes, a
//!   stored or committed version on the data nodes, or zeros);
//! - [`Content::write`] applies a write, or says which stripe must be fetched first
//!   (a partial write of a stripe that has data elsewhere);
//! - [`Content::start_store`] / [`Content::store_done`] move a dirty stripe to a new
//!   stored version; [`Content::begin_commit`] / [`Content::commit_done`] commit
//!   stored versions with compare-and-set on the version each was based on;
//! - [`Content::truncate`] and [`Content::set_committed`] follow size changes and
//!   other clients' commits.
//!
//! The committed layout of a large file is not loaded whole: a content made with
//! [`Content::with_head`] knows the records of the first window of stripes and of
//! every stripe at or past the committed size (none exist); the shell loads other
//! windows ([`Content::unknown_windows`], [`Content::load`]) before an operation
//! touches them, so an open costs the same for a 1 GiB and a 1 TiB file. Asking a
//! core about a stripe whose window is not loaded is a bug in the shell and panics
//! (answering "no data" would read zeros where data is).
//!
//! Every handle of the file on this client shares one `Content` (what one handle
//! writes, the others read at once, as on a local filesystem). Errors are reported
//! Linux-style (errseq): a stripe that could not be stored, or a commit that lost a
//! race with another client, is recorded once with a sequence number, and each handle
//! reports it at its next fsync or close ([`Content::error_since`]); its data is
//! dropped and the committed content and size stay as they were.
//!
//! Versions no longer needed — superseded before they were committed, replaced by a
//! commit (after it succeeded), cut off by a truncate, or left by a failed store — are
//! queued as garbage ([`Content::take_garbage`]) for the shell to delete on the nodes.

use bytes::{Bytes, BytesMut};
use shingle_meta::ids::NodeId;
use shingle_meta::namespace::{Errno, StripeRec, StripeWrite};
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

/// Largest file size: offsets past this fail with `EFBIG`.
pub use shingle_meta::namespace::MAX_FILE_BYTES;

/// Where bytes of a read come from, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    /// This many zero bytes (a hole, or past a stripe's stored length).
    Zeros(usize),
    /// Bytes held in memory.
    Local(Bytes),
    /// Bytes `range` of the data of stripe `stripe` as stored under `rec`.
    Remote {
        /// Stripe index.
        stripe: u64,
        /// Its stored version.
        rec: StripeRec,
        /// Byte range within the stripe's data (within `rec.len`).
        range: Range<usize>,
    },
}

/// A version no longer referenced by this client: delete it on the data nodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Garbage {
    /// Stripe index.
    pub stripe: u64,
    /// The version.
    pub version: u64,
    /// Where its shards went, if known (empty: the stripe's placement group).
    pub nodes: Vec<Option<NodeId>>,
}

/// A write that needs a stripe's current bytes first (read-modify-write).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NeedFetch {
    /// Stripe index.
    pub stripe: u64,
    /// The version to fetch.
    pub rec: StripeRec,
}

/// What [`Content::write`] and [`Content::truncate`] answer when they cannot proceed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Blocked {
    /// Fetch this stripe and [`Content::fill`] it, then call again.
    Fetch(NeedFetch),
    /// Refused.
    Error(Errno),
}

/// A commit to send: the stored stripes and the size they make.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitPlan {
    /// Stripes with the versions they replace.
    pub writes: Vec<StripeWrite>,
    /// The size the commit makes (it only grows the committed size).
    pub size: u64,
}

#[derive(Clone, Debug)]
enum State {
    /// Modified in memory: `valid` bytes of `buf` are the stripe's data.
    Dirty { buf: BytesMut, valid: usize },
    /// Being stored under `version`.
    Storing { data: Bytes, version: u64 },
    /// Stored, waiting to be committed.
    Stored { rec: StripeRec },
}

#[derive(Clone, Debug)]
struct Slot {
    /// The committed version this stripe's local content is based on (0: none).
    base: u64,
    state: State,
}

/// One file's content on one client. See the module documentation.
#[derive(Clone, Debug)]
pub struct Content {
    sb: u64,
    committed: BTreeMap<u64, StripeRec>,
    /// Which committed records are known: `None` all of them, else the loaded windows.
    loaded: Option<BTreeSet<u64>>,
    /// Stripes per window.
    window: u64,
    /// Stripes from this one on had no committed record when the layout was read.
    known_from: u64,
    committed_size: u64,
    slots: BTreeMap<u64, Slot>,
    size: u64,
    versions: Range<u64>,
    garbage: Vec<Garbage>,
    err_seq: u64,
    err: Option<Errno>,
}

impl Content {
    /// The content of a file whose committed layout has `stripes` of `stripe_bytes`
    /// each and whose committed size is `size`.
    pub fn new(stripe_bytes: u64, stripes: BTreeMap<u64, StripeRec>, size: u64) -> Content {
        assert!(stripe_bytes > 0, "a stripe holds at least one byte");
        Content {
            sb: stripe_bytes,
            committed: stripes,
            loaded: None,
            window: u64::MAX,
            known_from: 0,
            committed_size: size,
            slots: BTreeMap::new(),
            size,
            versions: 0..0,
            garbage: Vec::new(),
            err_seq: 0,
            err: None,
        }
    }

    /// The content of a file whose committed size is `size`, knowing only the records
    /// of its first window of `window` stripes (`head`, read with the size): other
    /// windows are loaded on demand ([`Content::load`]).
    pub fn with_head(stripe_bytes: u64, window: u64, head: BTreeMap<u64, StripeRec>, size: u64) -> Content {
        let mut c = Content::new(stripe_bytes, BTreeMap::new(), size);
        c.set_head(window, head, size);
        c
    }

    /// Stripes per window of records loaded at once (`u64::MAX`: all are known).
    pub fn window(&self) -> u64 {
        self.window
    }

    /// Whether the committed record (or its absence) of stripe `s` is known.
    pub fn known(&self, s: u64) -> bool {
        match &self.loaded {
            None => true,
            Some(w) => s >= self.known_from || w.contains(&(s / self.window)),
        }
    }

    /// The windows holding stripes `from..to` whose records are not known yet, in
    /// order: the shell loads them before an operation on those stripes.
    pub fn unknown_windows(&self, from: u64, to: u64) -> Vec<u64> {
        let Some(loaded) = &self.loaded else {
            return Vec::new();
        };
        let to = to.min(self.known_from);
        if from >= to {
            return Vec::new();
        }
        (from / self.window..=(to - 1) / self.window)
            .filter(|w| !loaded.contains(w))
            .collect()
    }

    /// The stripes bytes `[offset, offset + len)` lie in: `from..to`.
    pub fn stripe_span(&self, offset: u64, len: u64) -> (u64, u64) {
        (offset / self.sb, offset.saturating_add(len).div_ceil(self.sb))
    }

    /// The windows an operation on bytes `[offset, offset + len)` needs loaded.
    pub fn unknown_for(&self, offset: u64, len: u64) -> Vec<u64> {
        let (from, to) = self.stripe_span(offset, len);
        self.unknown_windows(from, to)
    }

    /// The committed records of window `w` as the metadata service has them now.
    pub fn load(&mut self, w: u64, recs: impl IntoIterator<Item = (u64, StripeRec)>) {
        let Some(loaded) = self.loaded.as_mut() else {
            return;
        };
        let lo = w.saturating_mul(self.window);
        let hi = lo.saturating_add(self.window);
        let old: Vec<u64> = self.committed.range(lo..hi).map(|(s, _)| *s).collect();
        for s in old {
            self.committed.remove(&s);
        }
        for (s, r) in recs {
            if (lo..hi).contains(&s) {
                self.committed.insert(s, r);
            }
        }
        loaded.insert(w);
    }

    /// The committed record of stripe `s`: its record must be known.
    fn rec_of(&self, s: u64) -> Option<&StripeRec> {
        assert!(
            self.known(s),
            "stripe {s}'s committed record was used before its window was loaded"
        );
        self.committed.get(&s)
    }

    /// Bytes per stripe.
    pub fn stripe_bytes(&self) -> u64 {
        self.sb
    }

    /// The size as seen through this client (including what is not committed yet).
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The committed size as last known.
    pub fn committed_size(&self) -> u64 {
        self.committed_size
    }

    /// The committed record of stripe `s`, as last known (its window must be loaded).
    pub fn committed(&self, s: u64) -> Option<&StripeRec> {
        self.rec_of(s)
    }

    /// True while something is written here and not committed.
    pub fn has_local(&self) -> bool {
        !self.slots.is_empty()
    }

    /// Stripes held dirty in memory.
    pub fn dirty_stripes(&self) -> Vec<u64> {
        self.slots
            .iter()
            .filter(|(_, sl)| matches!(sl.state, State::Dirty { .. }))
            .map(|(s, _)| *s)
            .collect()
    }

    /// Dirty stripes whose every byte is written (ready to store).
    pub fn full_stripes(&self) -> Vec<u64> {
        self.slots
            .iter()
            .filter(|(_, sl)| matches!(&sl.state, State::Dirty { valid, .. } if *valid as u64 == self.sb))
            .map(|(s, _)| *s)
            .collect()
    }

    /// Stripes stored and waiting for a commit.
    pub fn stored_count(&self) -> usize {
        self.slots
            .values()
            .filter(|sl| matches!(sl.state, State::Stored { .. }))
            .count()
    }

    /// The current error sequence number (a handle remembers it at open).
    pub fn err_seq(&self) -> u64 {
        self.err_seq
    }

    /// The error recorded since sequence `seen`, with the sequence to remember now.
    pub fn error_since(&self, seen: u64) -> Option<(Errno, u64)> {
        (self.err_seq > seen).then(|| (self.err.unwrap_or(Errno::EIO), self.err_seq))
    }

    fn record_error(&mut self, e: Errno) {
        self.err_seq += 1;
        self.err = Some(e);
    }

    /// Versions to delete on the data nodes (taken: each is returned once).
    pub fn take_garbage(&mut self) -> Vec<Garbage> {
        std::mem::take(&mut self.garbage)
    }

    fn discard(&mut self, stripe: u64, version: u64, nodes: Vec<Option<NodeId>>) {
        self.garbage.push(Garbage { stripe, version, nodes });
    }

    /// True when no reserved version is left for a store.
    pub fn needs_versions(&self) -> bool {
        self.versions.is_empty()
    }

    /// Whether no versions were ever handed to this content (a file just created).
    pub fn never_had_versions(&self) -> bool {
        self.versions.end == 0
    }

    /// Versions `first..first + count` were handed out to this client.
    pub fn add_versions(&mut self, first: u64, count: u32) {
        // Kept in release builds: a range that overlapped one handed out before would
        // store two stripes under one version, and a reader could get either.
        assert!(
            first > 0 && first >= self.versions.end,
            "stripe versions must only grow: {first} handed out after {:?}",
            self.versions
        );
        self.versions = first..first.saturating_add(u64::from(count));
    }

    /// Bytes of stripe `s` that lie below the size.
    fn in_size(&self, s: u64) -> usize {
        self.size.saturating_sub(s * self.sb).min(self.sb) as usize
    }

    /// The end of the data this client holds or knows committed: the size a failed
    /// store falls back to.
    fn local_end(&self) -> u64 {
        let mut end = self.committed_size;
        for (s, sl) in &self.slots {
            let len = match &sl.state {
                State::Dirty { valid, .. } => *valid as u64,
                State::Storing { data, .. } => data.len() as u64,
                State::Stored { rec } => rec.len,
            };
            if len > 0 {
                end = end.max(s * self.sb + len);
            }
        }
        end
    }

    /// Where the bytes `[offset, offset + len)` come from, clipped at the size.
    pub fn read_plan(&self, offset: u64, len: u64) -> Vec<Piece> {
        let end = offset.saturating_add(len).min(self.size);
        let mut out = Vec::new();
        let mut pos = offset;
        while pos < end {
            let s = pos / self.sb;
            let start = s * self.sb;
            let lo = (pos - start) as usize;
            let hi = (end.min(start + self.sb) - start) as usize;
            let zeros_from = |have: usize, out: &mut Vec<Piece>| {
                if hi > have.max(lo) {
                    out.push(Piece::Zeros(hi - have.max(lo)));
                }
            };
            match self.slots.get(&s).map(|sl| &sl.state) {
                Some(State::Dirty { buf, valid }) => {
                    if *valid > lo {
                        out.push(Piece::Local(Bytes::copy_from_slice(&buf[lo..hi.min(*valid)])));
                    }
                    zeros_from(*valid, &mut out);
                }
                Some(State::Storing { data, .. }) => {
                    if data.len() > lo {
                        out.push(Piece::Local(data.slice(lo..hi.min(data.len()))));
                    }
                    zeros_from(data.len(), &mut out);
                }
                Some(State::Stored { rec }) => self.remote(s, rec, lo, hi, &mut out),
                None => match self.rec_of(s) {
                    Some(rec) => self.remote(s, rec, lo, hi, &mut out),
                    None => out.push(Piece::Zeros(hi - lo)),
                },
            }
            pos = start + hi as u64;
        }
        out
    }

    fn remote(&self, s: u64, rec: &StripeRec, lo: usize, hi: usize, out: &mut Vec<Piece>) {
        let have = (rec.len as usize).min(self.sb as usize);
        if have > lo {
            out.push(Piece::Remote {
                stripe: s,
                rec: rec.clone(),
                range: lo..hi.min(have),
            });
        }
        if hi > have.max(lo) {
            out.push(Piece::Zeros(hi - have.max(lo)));
        }
    }

    /// The stripe's bytes elsewhere that a write of `lo..hi` of it would keep: `Some`
    /// when they must be fetched first.
    fn needs_fetch(&self, s: u64, lo: usize, hi: usize) -> Option<NeedFetch> {
        let rec = match self.slots.get(&s).map(|sl| &sl.state) {
            Some(State::Dirty { .. } | State::Storing { .. }) => return None,
            Some(State::Stored { rec }) => rec,
            None => self.rec_of(s)?,
        };
        let have = (rec.len as usize).min(self.in_size(s));
        // Nothing to keep when the write covers every byte the stripe has.
        if have == 0 || (lo == 0 && hi >= have) {
            return None;
        }
        Some(NeedFetch {
            stripe: s,
            rec: rec.clone(),
        })
    }

    /// Makes stripe `s` dirty, starting from `bytes` (its current data, fetched or
    /// local; empty for none), and returns its buffer.
    fn make_dirty(&mut self, s: u64, bytes: &[u8]) -> &mut Slot {
        let in_size = self.in_size(s);
        let sb = self.sb as usize;
        let base = self
            .slots
            .get(&s)
            .map_or_else(|| self.rec_of(s).map_or(0, |r| r.version), |sl| sl.base);
        if let Some(Slot {
            state: State::Stored { rec },
            ..
        }) = self.slots.get(&s)
        {
            // Stored but never committed: superseded by what is written now.
            let (v, nodes) = (rec.version, rec.nodes.clone());
            self.discard(s, v, nodes);
        }
        let mut buf = BytesMut::zeroed(sb);
        let n = bytes.len().min(sb).min(in_size);
        buf[..n].copy_from_slice(&bytes[..n]);
        // Bytes below the end of file are defined (zeros in a hole).
        let valid = n.max(in_size);
        self.slots.insert(
            s,
            Slot {
                base,
                state: State::Dirty { buf, valid },
            },
        );
        self.slots.get_mut(&s).expect("just inserted")
    }

    /// Stripe `s`'s data, fetched as [`Blocked::Fetch`] asked (the version it named).
    /// Ignored unless the stripe still has that version and no local bytes.
    pub fn fill(&mut self, s: u64, version: u64, bytes: &[u8]) {
        let current = match self.slots.get(&s).map(|sl| &sl.state) {
            Some(State::Stored { rec }) => Some(rec.version),
            Some(_) => None,
            None => self.rec_of(s).map(|r| r.version),
        };
        if current == Some(version) {
            self.make_dirty(s, bytes);
        }
    }

    /// Writes `data` at `offset`: all of it, or nothing and why not.
    pub fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), Blocked> {
        let end = offset
            .checked_add(data.len() as u64)
            .filter(|e| *e <= MAX_FILE_BYTES)
            .ok_or(Blocked::Error(Errno::EFBIG))?;
        // Everything that must be fetched is found before anything changes.
        let mut pos = offset;
        while pos < end {
            let s = pos / self.sb;
            let start = s * self.sb;
            let (lo, hi) = ((pos - start) as usize, (end.min(start + self.sb) - start) as usize);
            if let Some(f) = self.needs_fetch(s, lo, hi) {
                return Err(Blocked::Fetch(f));
            }
            pos = start + hi as u64;
        }
        let mut pos = offset;
        while pos < end {
            let s = pos / self.sb;
            let start = s * self.sb;
            let (lo, hi) = ((pos - start) as usize, (end.min(start + self.sb) - start) as usize);
            let src = &data[(pos - offset) as usize..(pos - offset) as usize + (hi - lo)];
            let local = match self.slots.get(&s).map(|sl| &sl.state) {
                Some(State::Dirty { .. }) => None,
                Some(State::Storing { data, .. }) => Some(data.clone()),
                // Stored or committed: the write covers all of it (checked above).
                _ => Some(Bytes::new()),
            };
            if let Some(from) = local {
                self.make_dirty(s, &from);
            }
            if let Some(Slot {
                state: State::Dirty { buf, valid },
                ..
            }) = self.slots.get_mut(&s)
            {
                buf[lo..hi].copy_from_slice(src);
                *valid = (*valid).max(hi);
            }
            pos = start + hi as u64;
            self.size = self.size.max(pos);
        }
        Ok(())
    }

    /// Cuts or extends the file to `size`. A cut inside a stripe that has bytes
    /// elsewhere past the cut needs them fetched first (the stripe is rewritten short,
    /// so a later extension reads zeros there). Stripes wholly past the cut are
    /// dropped here; committed ones when [`Content::truncated`] confirms the cut.
    pub fn truncate(&mut self, size: u64) -> Result<(), Blocked> {
        if size > MAX_FILE_BYTES {
            return Err(Blocked::Error(Errno::EFBIG));
        }
        let (s, within) = (size / self.sb, (size % self.sb) as usize);
        if within != 0 {
            let remote_len = match self.slots.get(&s).map(|sl| &sl.state) {
                Some(State::Stored { rec }) => Some(rec),
                Some(_) => None,
                None => self.rec_of(s),
            }
            .map(|rec| (rec.len as usize).min(self.in_size(s)));
            if remote_len.is_some_and(|have| have > within) {
                if let Some(f) = self.needs_fetch(s, 0, within) {
                    return Err(Blocked::Fetch(f));
                }
            }
            if let Some(Slot {
                state: State::Storing { data, .. },
                ..
            }) = self.slots.get(&s)
                && data.len() > within
            {
                let from = data.clone();
                self.make_dirty(s, &from);
            }
            if let Some(Slot {
                state: State::Dirty { buf, valid },
                ..
            }) = self.slots.get_mut(&s)
            {
                buf[within..].fill(0);
                *valid = (*valid).min(within);
            }
        }
        let keep = size.div_ceil(self.sb);
        let cut: Vec<u64> = self.slots.range(keep..).map(|(s, _)| *s).collect();
        for s in cut {
            if let Some(Slot {
                state: State::Stored { rec },
                ..
            }) = self.slots.remove(&s)
            {
                self.discard(s, rec.version, rec.nodes);
            }
        }
        self.size = size;
        Ok(())
    }

    /// The metadata service has cut (or extended) the committed file to `size`: the
    /// committed stripes wholly past it are gone (their versions are garbage; the shell
    /// loads their windows before the cut, so it knows them).
    pub fn truncated(&mut self, size: u64) {
        let keep = size.div_ceil(self.sb);
        self.known_from = self.known_from.min(keep);
        let cut: Vec<u64> = self.committed.range(keep..).map(|(s, _)| *s).collect();
        for s in cut {
            if let Some(rec) = self.committed.remove(&s) {
                self.discard(s, rec.version, rec.nodes);
            }
        }
        self.committed_size = size;
        self.size = size.max(self.local_end().min(self.size));
    }

    /// Starts storing dirty stripe `s` under the next reserved version: the bytes to
    /// store and the version, or `None` when it is not dirty or no version is left
    /// ([`Content::needs_versions`]).
    pub fn start_store(&mut self, s: u64) -> Option<(Bytes, u64)> {
        if self.versions.is_empty() {
            return None;
        }
        let slot = self.slots.get_mut(&s)?;
        let State::Dirty { buf, valid } = &mut slot.state else {
            return None;
        };
        let version = self.versions.start;
        self.versions.start += 1;
        let data = std::mem::take(buf).freeze().slice(..*valid);
        slot.state = State::Storing {
            data: data.clone(),
            version,
        };
        Some((data, version))
    }

    /// The store of stripe `s` under `version` finished: `Ok` with the record (where
    /// its shards went), or failed — then its data is dropped (unless written again
    /// meanwhile), the error is recorded for every handle, and the size falls back.
    pub fn store_done(&mut self, s: u64, version: u64, result: Result<StripeRec, Errno>) {
        let current = matches!(
            self.slots.get(&s),
            Some(Slot { state: State::Storing { version: v, .. }, .. }) if *v == version
        );
        match result {
            Ok(rec) if current => {
                if let Some(slot) = self.slots.get_mut(&s) {
                    slot.state = State::Stored { rec };
                }
            }
            Ok(rec) => self.discard(s, version, rec.nodes),
            Err(e) => {
                self.discard(s, version, Vec::new());
                if current {
                    self.slots.remove(&s);
                    self.record_error(e);
                    self.size = self.local_end();
                }
            }
        }
    }

    /// The stored stripes to commit now, or `None` when there are none.
    pub fn begin_commit(&self) -> Option<CommitPlan> {
        let mut writes = Vec::new();
        let mut size = self.committed_size;
        for (s, sl) in &self.slots {
            if let State::Stored { rec } = &sl.state {
                size = size.max(s * self.sb + rec.len);
                writes.push(StripeWrite {
                    stripe: *s,
                    base: sl.base,
                    rec: rec.clone(),
                });
            }
        }
        // The size the commit makes never exceeds what this client sees.
        (!writes.is_empty()).then_some(CommitPlan {
            writes,
            size: size.min(self.size.max(self.committed_size)),
        })
    }

    /// The commit `plan` finished with `result` (the new committed size on success).
    /// `ESTALE` (another writer committed one of the stripes first) drops the plan's
    /// stripes, records the error for every handle, and returns true: the caller must
    /// reload the committed layout. Other errors change nothing (the caller reports
    /// them; a later commit retries).
    pub fn commit_done(&mut self, plan: &CommitPlan, result: Result<u64, Errno>) -> bool {
        match result {
            Ok(size) => {
                for w in &plan.writes {
                    if let Some(old) = self.committed.insert(w.stripe, w.rec.clone())
                        && old.version != w.rec.version
                    {
                        self.discard(w.stripe, old.version, old.nodes);
                    }
                    let same = matches!(
                        self.slots.get(&w.stripe),
                        Some(Slot { state: State::Stored { rec }, .. }) if rec.version == w.rec.version
                    );
                    if same {
                        self.slots.remove(&w.stripe);
                    } else if let Some(slot) = self.slots.get_mut(&w.stripe) {
                        slot.base = w.rec.version;
                    }
                }
                self.committed_size = self.committed_size.max(size);
                self.size = self.size.max(self.committed_size);
                false
            }
            Err(Errno::ESTALE) => {
                for w in &plan.writes {
                    let same = matches!(
                        self.slots.get(&w.stripe),
                        Some(Slot { state: State::Stored { rec }, .. }) if rec.version == w.rec.version
                    );
                    if same {
                        self.slots.remove(&w.stripe);
                    }
                    self.discard(w.stripe, w.rec.version, w.rec.nodes.clone());
                }
                self.record_error(Errno::EIO);
                self.size = self.local_end();
                true
            }
            Err(_) => false,
        }
    }

    /// The committed layout and size as the metadata service now has them (at open,
    /// or after another client's change). Local writes stay; their bases are kept, so
    /// a conflict shows at their commit.
    pub fn set_committed(&mut self, stripes: BTreeMap<u64, StripeRec>, size: u64) {
        self.committed = stripes;
        self.loaded = None;
        self.window = u64::MAX;
        self.committed_size = size;
        self.size = if self.slots.is_empty() {
            size
        } else {
            size.max(self.local_end())
        };
    }

    /// Like [`Content::set_committed`], knowing only the first window (`head`) of the
    /// layout; the rest is loaded on demand.
    pub fn set_head(&mut self, window: u64, head: BTreeMap<u64, StripeRec>, size: u64) {
        let window = window.max(1);
        self.set_committed(head, size);
        self.committed.retain(|s, _| *s < window);
        self.window = window;
        self.known_from = size.div_ceil(self.sb);
        self.loaded = Some(BTreeSet::from([0]));
    }

    /// Records a failure that lost written data (reported by every handle once).
    pub fn fail(&mut self, e: Errno) {
        self.record_error(e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(version: u64, len: u64) -> StripeRec {
        StripeRec {
            version,
            len,
            nodes: vec![],
        }
    }

    /// The metadata service validates policies by the data nodes' limits: the two
    /// crates must agree on them.
    #[test]
    fn metadata_and_data_agree_on_policy_limits() {
        use shingle_meta::namespace::types::MAX_UNIT_BYTES;
        assert_eq!(MAX_UNIT_BYTES, shingle_data::ec::MAX_UNIT_BYTES);
        let p = |k, m, unit| shingle_meta::namespace::Layout {
            k,
            m,
            unit,
            ..Default::default()
        };
        for (k, m, unit) in [
            (4, 2, 1 << 20),
            (1, 1, 4096),
            (16, 16, MAX_UNIT_BYTES),
            (4, 0, 1 << 20),
            (0, 2, 4096),
            (30, 3, 4096),
            (4, 2, MAX_UNIT_BYTES + 4096),
        ] {
            let meta_ok = p(k, m, unit).policy_is_valid();
            let data_ok = shingle_data::ec::EcPolicy::new(k, m, unit).is_ok();
            assert_eq!(meta_ok, data_ok, "{k}+{m} unit {unit}");
        }
    }

    #[test]
    fn partial_write_of_a_committed_stripe_fetches_it_first() {
        let mut c = Content::new(16, BTreeMap::from([(0, rec(5, 16))]), 16);
        c.add_versions(10, 4);
        let Err(Blocked::Fetch(f)) = c.write(4, b"ab") else {
            panic!("a partial write must fetch");
        };
        assert_eq!(f.rec.version, 5);
        c.fill(0, 5, &[7u8; 16]);
        c.write(4, b"ab").expect("write");
        let mut want = vec![7u8; 16];
        want[4..6].copy_from_slice(b"ab");
        assert_eq!(c.read_plan(0, 16), vec![Piece::Local(Bytes::from(want))]);
        // A write of the whole stripe needs nothing fetched.
        let mut d = Content::new(16, BTreeMap::from([(0, rec(5, 16))]), 16);
        d.write(0, &[1u8; 16]).expect("full write");
    }

    #[test]
    fn stored_versions_are_read_from_the_nodes_until_committed() {
        let mut c = Content::new(16, BTreeMap::new(), 0);
        c.add_versions(10, 4);
        c.write(0, &[3u8; 16]).expect("write");
        let (data, v) = c.start_store(0).expect("store");
        assert_eq!((data.len(), v), (16, 10));
        c.store_done(0, v, Ok(rec(v, 16)));
        assert!(matches!(&c.read_plan(0, 4)[..], [Piece::Remote { rec, .. }] if rec.version == 10));
        let plan = c.begin_commit().expect("a commit");
        assert_eq!((plan.writes[0].base, plan.size), (0, 16));
        assert!(!c.commit_done(&plan, Ok(16)));
        assert!(!c.has_local());
        assert_eq!(c.committed(0).map(|r| r.version), Some(10));
    }

    #[test]
    fn a_failed_store_drops_the_stripe_and_reports_once_per_handle() {
        let mut c = Content::new(16, BTreeMap::new(), 0);
        c.add_versions(1, 8);
        let seen = c.err_seq();
        c.write(0, &[1u8; 20]).expect("write");
        assert_eq!(c.size(), 20);
        let (_, v) = c.start_store(1).expect("store");
        c.store_done(1, v, Err(Errno::ENOSPC));
        assert_eq!(c.size(), 16, "the size falls back with the lost stripe");
        let (e, now) = c.error_since(seen).expect("reported");
        assert_eq!(e, Errno::ENOSPC);
        assert_eq!(c.error_since(now), None, "reported once");
        assert_eq!(c.take_garbage().len(), 1, "its partial shards are deleted");
    }

    #[test]
    fn a_lost_commit_race_drops_the_stripes_and_asks_for_a_reload() {
        let mut c = Content::new(16, BTreeMap::from([(0, rec(5, 16))]), 16);
        c.add_versions(10, 4);
        c.write(0, &[9u8; 16]).expect("write");
        let (_, v) = c.start_store(0).expect("store");
        c.store_done(0, v, Ok(rec(v, 16)));
        let plan = c.begin_commit().expect("commit");
        assert_eq!(plan.writes[0].base, 5);
        assert!(c.commit_done(&plan, Err(Errno::ESTALE)));
        assert!(c.error_since(0).is_some());
        assert!(!c.has_local());
    }

    #[test]
    fn truncate_cuts_a_stripe_and_an_extension_reads_zeros() {
        let mut c = Content::new(16, BTreeMap::from([(0, rec(5, 16)), (1, rec(6, 16))]), 32);
        let Err(Blocked::Fetch(f)) = c.truncate(4) else {
            panic!("a cut inside a stored stripe fetches it");
        };
        assert_eq!(f.stripe, 0);
        c.fill(0, 5, &[4u8; 16]);
        c.truncate(4).expect("truncate");
        c.truncated(4);
        assert_eq!(c.take_garbage().iter().map(|g| g.version).collect::<Vec<_>>(), vec![6]);
        c.truncate(20).expect("extend");
        let mut got = Vec::new();
        for p in c.read_plan(0, 20) {
            match p {
                Piece::Local(b) => got.extend_from_slice(&b),
                Piece::Zeros(n) => got.resize(got.len() + n, 0),
                Piece::Remote { .. } => panic!("nothing remote is left"),
            }
        }
        let mut want = vec![4u8; 4];
        want.resize(20, 0);
        assert_eq!(got, want);
    }
}
