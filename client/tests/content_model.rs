//! Reference-model test of the open-file content core ([`Content`]): random writes,
//! reads, truncates, stores (some failing), commits (some losing a race with another
//! writer), garbage collection and close/reopen, checked against a plain `Vec<u8>`
//! over thousands of seeds. The "world" around the core is a minimal metadata service
//! (compare-and-set commits, version reservations) and data nodes (versions by name);
//! reading a version that was deleted while the core still referenced it fails the
//! test. Odd seeds open the file as the shell does, knowing only the first window of
//! its layout and loading the others before an operation touches them (the core panics
//! if asked about a stripe it does not know). Replay a failure with SHINGLE_SEED=<seed>.

// A scenario test reads top to bottom as the steps it runs (clippy.toml).
#![allow(clippy::too_many_lines)]

use shingle_client::content::{Blocked, Content, Piece};
use shingle_meta::namespace::{Errno, StripeRec};
use std::collections::{BTreeMap, HashMap};

const SB: u64 = 64;

use shingle_testkit::Rng;

/// Stripes per window of a lazily loaded layout.
const WINDOW: u64 = 2;

#[derive(Default)]
struct World {
    /// Open files knowing only the layout's first window.
    lazy: bool,
    stripes: BTreeMap<u64, StripeRec>,
    size: u64,
    next_version: u64,
    nodes: HashMap<(u64, u64), Vec<u8>>,
}

impl World {
    fn reserve(&mut self, n: u32) -> u64 {
        let first = self.next_version.max(1);
        self.next_version = first + u64::from(n);
        first
    }

    fn bytes(&self, c: &Content, off: u64, len: u64, seed: u64, step: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for p in c.read_plan(off, len) {
            match p {
                Piece::Zeros(n) => out.resize(out.len() + n, 0),
                Piece::Local(b) => out.extend_from_slice(&b),
                Piece::Remote { stripe, rec, range } => {
                    let data = self.nodes.get(&(stripe, rec.version)).unwrap_or_else(|| {
                        panic!(
                            "seed {seed} step {step}: stripe {stripe} v{} was deleted while in use",
                            rec.version
                        )
                    });
                    assert!(
                        range.end <= data.len(),
                        "seed {seed} step {step}: range past the stored bytes"
                    );
                    out.extend_from_slice(&data[range]);
                }
            }
        }
        out
    }

    /// The committed content, as a fresh open reads it.
    fn content(&self) -> Content {
        if self.lazy {
            Content::with_head(SB, WINDOW, self.head(), self.size)
        } else {
            self.complete()
        }
    }

    /// The committed content with every stripe known.
    fn complete(&self) -> Content {
        Content::new(SB, self.stripes.clone(), self.size)
    }

    /// The records of the first window.
    fn head(&self) -> BTreeMap<u64, StripeRec> {
        self.stripes.range(..WINDOW).map(|(s, r)| (*s, r.clone())).collect()
    }

    /// Takes the committed layout again (after a lost race), as the shell does.
    fn reload(&self, c: &mut Content) {
        if self.lazy {
            c.set_head(WINDOW, self.head(), self.size);
        } else {
            c.set_committed(self.stripes.clone(), self.size);
        }
    }

    /// Loads what an operation on bytes `off..off + len` needs, as the shell does.
    fn ensure(&self, c: &mut Content, off: u64, len: u64) {
        for win in c.unknown_for(off, len) {
            let lo = win * c.window();
            c.load(
                win,
                self.stripes.range(lo..lo + c.window()).map(|(s, r)| (*s, r.clone())),
            );
        }
        assert!(c.unknown_for(off, len).is_empty());
    }

    fn gc(&mut self, c: &mut Content) {
        for g in c.take_garbage() {
            self.nodes.remove(&(g.stripe, g.version));
        }
    }

    fn store(&mut self, c: &mut Content, s: u64, fail: bool) -> Result<(), Errno> {
        if c.needs_versions() {
            let first = self.reserve(4);
            c.add_versions(first, 4);
        }
        let Some((data, v)) = c.start_store(s) else {
            return Ok(());
        };
        let r = if fail {
            // A failed store may leave some shards behind: garbage to delete.
            self.nodes.insert((s, v), data.to_vec());
            Err(Errno::EIO)
        } else {
            self.nodes.insert((s, v), data.to_vec());
            Ok(StripeRec {
                version: v,
                len: data.len() as u64,
                nodes: vec![],
            })
        };
        c.store_done(s, v, r.clone());
        r.map(|_| ())
    }

    /// Commits as the metadata service would (compare-and-set); true on a lost race.
    fn commit(&mut self, c: &mut Content) -> bool {
        let Some(plan) = c.begin_commit() else { return false };
        let stale = plan.writes.iter().any(|w| {
            let cur = self.stripes.get(&w.stripe).map_or(0, |r| r.version);
            cur != w.base && cur != w.rec.version
        });
        let r = if stale {
            Err(Errno::ESTALE)
        } else {
            for w in &plan.writes {
                self.stripes.insert(w.stripe, w.rec.clone());
            }
            self.size = self.size.max(plan.size);
            Ok(self.size)
        };
        c.commit_done(&plan, r)
    }

    /// Another client rewrites stripe `s` wholly and commits it.
    fn other_writer(&mut self, s: u64, fill: u8) {
        let v = self.reserve(1);
        let len = SB.min(self.size.saturating_sub(s * SB).max(1)) as usize;
        self.nodes.insert((s, v), vec![fill; len]);
        self.stripes.insert(
            s,
            StripeRec {
                version: v,
                len: len as u64,
                nodes: vec![],
            },
        );
        self.size = self.size.max(s * SB + len as u64);
    }

    fn reference(&self) -> Vec<u8> {
        let c = self.complete();
        self.bytes(&c, 0, self.size, 0, 0)
    }
}

fn apply(r: &mut Vec<u8>, off: u64, data: &[u8]) {
    let end = off as usize + data.len();
    if r.len() < end {
        r.resize(end, 0);
    }
    r[off as usize..end].copy_from_slice(data);
}

fn write(w: &mut World, c: &mut Content, off: u64, data: &[u8]) {
    w.ensure(c, off, data.len() as u64);
    loop {
        match c.write(off, data) {
            Ok(()) => return,
            Err(Blocked::Fetch(f)) => {
                let bytes = w.nodes[&(f.stripe, f.rec.version)].clone();
                c.fill(f.stripe, f.rec.version, &bytes);
            }
            Err(Blocked::Error(e)) => panic!("write refused: {e:?}"),
        }
    }
}

fn truncate(w: &mut World, c: &mut Content, size: u64) {
    // The stripe the cut lands in and every stripe it removes.
    w.ensure(c, size / SB * SB, u64::MAX - size);
    loop {
        match c.truncate(size) {
            Ok(()) => return,
            Err(Blocked::Fetch(f)) => {
                let bytes = w.nodes[&(f.stripe, f.rec.version)].clone();
                c.fill(f.stripe, f.rec.version, &bytes);
            }
            Err(Blocked::Error(e)) => panic!("truncate refused: {e:?}"),
        }
    }
}

fn run(seed: u64) {
    let mut rng = Rng::seeded(seed);
    let mut w = World {
        lazy: seed % 2 == 1,
        ..World::default()
    };
    let mut c = w.content();
    let mut r: Vec<u8> = Vec::new();
    let mut seen = c.err_seq();
    for step in 0..120 {
        match rng.below(100) {
            0..=34 => {
                let off = rng.below(SB * 6);
                let len = 1 + rng.below(SB * 2);
                let byte = (step % 250) as u8 + 1;
                let data: Vec<u8> = (0..len).map(|i| byte.wrapping_add(i as u8)).collect();
                write(&mut w, &mut c, off, &data);
                apply(&mut r, off, &data);
            }
            35..=49 => {
                let off = rng.below(SB * 7);
                let len = rng.below(SB * 3);
                w.ensure(&mut c, off, len);
                let got = w.bytes(&c, off, len, seed, step);
                let end = (off + len).min(r.len() as u64);
                let want = if off >= end {
                    &[][..]
                } else {
                    &r[off as usize..end as usize]
                };
                assert_eq!(got, want, "seed {seed} step {step}: read {off}+{len}");
                assert_eq!(c.size(), r.len() as u64, "seed {seed} step {step}: size");
            }
            50..=57 => {
                // Truncate: local cut, then the service's, as the shell does.
                let size = rng.below(SB * 6);
                for s in c.dirty_stripes() {
                    w.store(&mut c, s, false).expect("store");
                }
                assert!(!w.commit(&mut c), "no other writer here");
                truncate(&mut w, &mut c, size);
                for s in c.dirty_stripes() {
                    w.store(&mut c, s, false).expect("store");
                }
                assert!(!w.commit(&mut c));
                w.size = size;
                w.stripes.retain(|s, _| *s < size.div_ceil(SB));
                c.truncated(size);
                r.resize(size as usize, 0);
            }
            58..=69 => {
                // Store one dirty stripe; one in five fails.
                let dirty = c.dirty_stripes();
                if dirty.is_empty() {
                    continue;
                }
                let s = dirty[rng.below(dirty.len() as u64) as usize];
                let fail = rng.below(5) == 0;
                let before = c.size();
                let res = w.store(&mut c, s, fail);
                if fail {
                    assert_eq!(res, Err(Errno::EIO));
                    let (e, now) = c.error_since(seen).expect("a failed store is reported");
                    assert_eq!(e, Errno::EIO);
                    seen = now;
                    assert!(
                        c.size() <= before && c.size() >= w.size.min(before),
                        "seed {seed} step {step}"
                    );
                    // The stripe reads as it was stored or committed before; the rest
                    // of what is below the new size is unchanged.
                    let n = c.size();
                    w.ensure(&mut c, 0, n);
                    let got = w.bytes(&c, 0, c.size(), seed, step);
                    let (lo, hi) = ((s * SB) as usize, ((s + 1) * SB) as usize);
                    let n = got.len();
                    assert_eq!(
                        &got[..lo.min(n)],
                        &r[..lo.min(n)],
                        "seed {seed} step {step}: before the lost stripe"
                    );
                    if hi < n {
                        assert_eq!(&got[hi..], &r[hi..n], "seed {seed} step {step}: after the lost stripe");
                    }
                    r = got;
                }
            }
            70..=79 => {
                // fsync / close: store everything, commit.
                let mut failed = false;
                for s in c.dirty_stripes() {
                    failed |= w.store(&mut c, s, false).is_err();
                }
                assert!(!failed);
                if w.commit(&mut c) {
                    panic!("seed {seed} step {step}: a lost race with no other writer");
                }
                assert!(!c.has_local(), "seed {seed} step {step}: committed everything");
                assert_eq!(w.reference(), r, "seed {seed} step {step}: committed content");
                w.gc(&mut c);
            }
            80..=85 => {
                // Close and reopen: a fresh open sees exactly what was committed.
                for s in c.dirty_stripes() {
                    w.store(&mut c, s, false).expect("store");
                }
                assert!(!w.commit(&mut c));
                w.gc(&mut c);
                c = w.content();
                seen = c.err_seq();
                let n = c.size();
                w.ensure(&mut c, 0, n);
                assert_eq!(
                    w.bytes(&c, 0, c.size(), seed, step),
                    r,
                    "seed {seed} step {step}: reopen"
                );
            }
            86..=91 => {
                // Another client commits a stripe this client may have written too.
                let s = rng.below(5);
                let touched = c.has_local();
                w.other_writer(s, 0xEE);
                for d in c.dirty_stripes() {
                    w.store(&mut c, d, false).expect("store");
                }
                let lost = w.commit(&mut c);
                if lost {
                    let (_, now) = c.error_since(seen).expect("a lost race is reported");
                    seen = now;
                    // The dropped writes are gone; the file is what the service has.
                    w.reload(&mut c);
                    r = w.reference();
                } else if !touched {
                    // Nothing of ours: the other writer's bytes show after a reopen.
                    c = w.content();
                    seen = c.err_seq();
                    r = w.reference();
                } else {
                    assert_eq!(w.reference(), {
                        let mut x = r.clone();
                        let end = (w.size as usize).max(x.len());
                        x.resize(end, 0);
                        let other = w.bytes(&w.complete(), s * SB, SB, seed, step);
                        x[(s * SB) as usize..(s * SB) as usize + other.len()].copy_from_slice(&other);
                        x
                    });
                    r = w.reference();
                    c = w.content();
                    seen = c.err_seq();
                }
                w.gc(&mut c);
            }
            _ => w.gc(&mut c),
        }
        // Memory stays bounded as the shell bounds it.
        while c.dirty_stripes().len() > 3 {
            let s = c.dirty_stripes()[0];
            w.store(&mut c, s, false).expect("store");
        }
    }
}

#[test]
fn content_matches_a_byte_vector_over_thousands_of_seeds() {
    let seeds: Vec<u64> = match std::env::var("SHINGLE_SEED") {
        Ok(s) => vec![s.parse().expect("SHINGLE_SEED is a number")],
        Err(_) => (1..=3000).collect(),
    };
    for seed in seeds {
        run(seed);
    }
}
