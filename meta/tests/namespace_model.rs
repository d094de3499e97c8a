//! Reference-model test of the partitioned namespace: random sequences of operations by
//! several users are run against the engine (many partitions, intents, injected
//! crashes) and against a plain single-table model of POSIX semantics; every result
//! (value or errno) and the whole tree must agree. Replay a failure with
//! SHINGLE_SEED=<seed>.

// A scenario test reads top to bottom as the steps it runs (clippy.toml).
#![allow(clippy::too_many_lines)]

use shingle_meta::ids::Ino;
use shingle_meta::namespace::perm;
use shingle_meta::namespace::types::{Attr, Creds, Errno, FileKind, NAME_MAX, S_ISVTX, SetAttr};
use shingle_meta::namespace::{Namespace, RenameFlags};
use shingle_meta::placement::dentry_partition;
use std::collections::BTreeMap;

// ---------------------------------------------------------------- the reference model

#[derive(Clone, Debug, PartialEq)]
struct MNode {
    kind: FileKind,
    perm: u32,
    uid: u32,
    gid: u32,
    nlink: u32,
    target: Option<Vec<u8>>,
    children: BTreeMap<Vec<u8>, usize>,
    parent: usize,
}

#[derive(Clone, Debug, PartialEq)]
struct Model {
    nodes: BTreeMap<usize, MNode>,
    next: usize,
}

fn mattr(id: usize, n: &MNode) -> Attr {
    Attr {
        ino: Ino(id as u64),
        kind: n.kind,
        perm: n.perm,
        uid: n.uid,
        gid: n.gid,
        nlink: n.nlink,
        size: 0,
        rdev: 0,
        atime: 0,
        mtime: 0,
        ctime: 0,
        crtime: 0,
    }
}

impl Model {
    fn new() -> Self {
        let root = MNode {
            kind: FileKind::Dir,
            perm: 0o755,
            uid: 0,
            gid: 0,
            nlink: 2,
            target: None,
            children: BTreeMap::new(),
            parent: 0,
        };
        Model {
            nodes: BTreeMap::from([(0, root)]),
            next: 1,
        }
    }

    fn n(&self, id: usize) -> &MNode {
        &self.nodes[&id]
    }

    fn dir(&self, c: &Creds, id: usize, mask: u32) -> Result<(), Errno> {
        let d = self.n(id);
        if d.kind != FileKind::Dir {
            return Err(Errno::ENOTDIR);
        }
        perm::check(c, &mattr(id, d), mask)
    }

    fn resolve(&self, path: &[Vec<u8>]) -> Option<usize> {
        let mut cur = 0;
        for comp in path {
            cur = *self.n(cur).children.get(comp)?;
        }
        Some(cur)
    }

    fn mknod(
        &mut self,
        c: &Creds,
        p: usize,
        name: &[u8],
        kind: FileKind,
        mode: u32,
        target: Option<&[u8]>,
    ) -> Result<(), Errno> {
        if name.len() > NAME_MAX {
            return Err(Errno::ENAMETOOLONG);
        }
        self.dir(c, p, perm::W | perm::X)?;
        if self.n(p).children.contains_key(name) {
            return Err(Errno::EEXIST);
        }
        let (gid, mode) = perm::new_owner(
            c,
            &mattr(p, self.n(p)),
            kind,
            if kind == FileKind::Symlink { 0o777 } else { mode },
        );
        let id = self.next;
        self.next += 1;
        self.nodes.insert(
            id,
            MNode {
                kind,
                perm: mode,
                uid: c.uid,
                gid,
                nlink: if kind == FileKind::Dir { 2 } else { 1 },
                target: target.map(<[u8]>::to_vec),
                children: BTreeMap::new(),
                parent: p,
            },
        );
        let pn = self.nodes.get_mut(&p).expect("parent");
        pn.children.insert(name.to_vec(), id);
        if kind == FileKind::Dir {
            pn.nlink += 1;
        }
        Ok(())
    }

    fn drop_link(&mut self, id: usize) {
        let n = self.nodes.get_mut(&id).expect("node");
        n.nlink -= 1;
        if n.nlink == 0 {
            self.nodes.remove(&id);
        }
    }

    fn unlink(&mut self, c: &Creds, p: usize, name: &[u8]) -> Result<(), Errno> {
        self.dir(c, p, perm::X)?;
        let id = *self.n(p).children.get(name).ok_or(Errno::ENOENT)?;
        if self.n(id).kind == FileKind::Dir {
            return Err(Errno::EISDIR);
        }
        perm::check_delete(c, &mattr(p, self.n(p)), &mattr(id, self.n(id)))?;
        self.nodes.get_mut(&p).expect("parent").children.remove(name);
        self.drop_link(id);
        Ok(())
    }

    fn rmdir(&mut self, c: &Creds, p: usize, name: &[u8]) -> Result<(), Errno> {
        self.dir(c, p, perm::X)?;
        let id = *self.n(p).children.get(name).ok_or(Errno::ENOENT)?;
        if self.n(id).kind != FileKind::Dir {
            return Err(Errno::ENOTDIR);
        }
        perm::check_delete(c, &mattr(p, self.n(p)), &mattr(id, self.n(id)))?;
        if !self.n(id).children.is_empty() {
            return Err(Errno::ENOTEMPTY);
        }
        let pn = self.nodes.get_mut(&p).expect("parent");
        pn.children.remove(name);
        pn.nlink -= 1;
        self.nodes.remove(&id);
        Ok(())
    }

    fn link(&mut self, c: &Creds, id: usize, np: usize, name: &[u8]) -> Result<(), Errno> {
        if self.n(id).kind == FileKind::Dir {
            return Err(Errno::EPERM);
        }
        self.dir(c, np, perm::W | perm::X)?;
        if self.n(np).children.contains_key(name) {
            return Err(Errno::EEXIST);
        }
        self.nodes.get_mut(&np).expect("dir").children.insert(name.to_vec(), id);
        self.nodes.get_mut(&id).expect("node").nlink += 1;
        Ok(())
    }

    fn within(&self, mut d: usize, anc: usize) -> bool {
        loop {
            if d == anc {
                return true;
            }
            if d == 0 {
                return false;
            }
            d = self.n(d).parent;
        }
    }

    fn rename(&mut self, c: &Creds, p: usize, name: &[u8], np: usize, nn: &[u8], f: RenameFlags) -> Result<(), Errno> {
        if f.noreplace && f.exchange {
            return Err(Errno::EINVAL);
        }
        self.dir(c, p, perm::W | perm::X)?;
        self.dir(c, np, perm::W | perm::X)?;
        let s = *self.n(p).children.get(name).ok_or(Errno::ENOENT)?;
        perm::check_delete(c, &mattr(p, self.n(p)), &mattr(s, self.n(s)))?;
        let d = self.n(np).children.get(nn).copied();
        if f.exchange && d.is_none() {
            return Err(Errno::ENOENT);
        }
        if p == np && name == nn {
            return Ok(());
        }
        let sdir = self.n(s).kind == FileKind::Dir;
        if sdir && np != p {
            if self.within(np, s) {
                return Err(Errno::EINVAL);
            }
            perm::check(c, &mattr(s, self.n(s)), perm::W)?;
        }
        match d {
            Some(_) if f.noreplace => Err(Errno::EEXIST),
            Some(d) if f.exchange => {
                perm::check_delete(c, &mattr(np, self.n(np)), &mattr(d, self.n(d)))?;
                let ddir = self.n(d).kind == FileKind::Dir;
                if ddir && np != p {
                    if self.within(p, d) {
                        return Err(Errno::EINVAL);
                    }
                    perm::check(c, &mattr(d, self.n(d)), perm::W)?;
                }
                self.nodes.get_mut(&np).expect("np").children.insert(nn.to_vec(), s);
                self.nodes.get_mut(&p).expect("p").children.insert(name.to_vec(), d);
                if sdir {
                    self.nodes.get_mut(&s).expect("s").parent = np;
                }
                if ddir {
                    self.nodes.get_mut(&d).expect("d").parent = p;
                }
                let moved = i64::from(sdir) - i64::from(ddir);
                let pn = self.nodes.get_mut(&p).expect("p");
                pn.nlink = (i64::from(pn.nlink) - moved) as u32;
                let npn = self.nodes.get_mut(&np).expect("np");
                npn.nlink = (i64::from(npn.nlink) + moved) as u32;
                Ok(())
            }
            Some(d) => {
                if d == s {
                    return Ok(());
                }
                perm::check_delete(c, &mattr(np, self.n(np)), &mattr(d, self.n(d)))?;
                let ddir = self.n(d).kind == FileKind::Dir;
                match (sdir, ddir) {
                    (true, false) => return Err(Errno::ENOTDIR),
                    (false, true) => return Err(Errno::EISDIR),
                    (true, true) if !self.n(d).children.is_empty() => return Err(Errno::ENOTEMPTY),
                    _ => {}
                }
                if ddir && self.within(p, d) {
                    return Err(Errno::EINVAL);
                }
                self.nodes.get_mut(&p).expect("p").children.remove(name);
                self.nodes.get_mut(&np).expect("np").children.insert(nn.to_vec(), s);
                if ddir {
                    self.nodes.remove(&d);
                    self.nodes.get_mut(&np).expect("np").nlink -= 1;
                } else {
                    self.drop_link(d);
                }
                if sdir {
                    self.nodes.get_mut(&s).expect("s").parent = np;
                    self.nodes.get_mut(&p).expect("p").nlink -= 1;
                    self.nodes.get_mut(&np).expect("np").nlink += 1;
                }
                Ok(())
            }
            None => {
                self.nodes.get_mut(&p).expect("p").children.remove(name);
                self.nodes.get_mut(&np).expect("np").children.insert(nn.to_vec(), s);
                if sdir {
                    self.nodes.get_mut(&s).expect("s").parent = np;
                    self.nodes.get_mut(&p).expect("p").nlink -= 1;
                    self.nodes.get_mut(&np).expect("np").nlink += 1;
                }
                Ok(())
            }
        }
    }

    fn chmod(&mut self, c: &Creds, id: usize, mode: u32) -> Result<(), Errno> {
        let a = perm::apply_setattr(
            c,
            &mattr(id, self.n(id)),
            &SetAttr {
                perm: Some(mode),
                ..Default::default()
            },
            1,
        )?;
        self.nodes.get_mut(&id).expect("node").perm = a.perm;
        Ok(())
    }

    /// The tree as (path → kind, perm, uid, gid, nlink, entries, target).
    fn tree(&self) -> BTreeMap<Vec<Vec<u8>>, Shape> {
        let mut out = BTreeMap::new();
        let mut stack = vec![(Vec::new(), 0usize)];
        while let Some((path, id)) = stack.pop() {
            let n = self.n(id);
            out.insert(
                path.clone(),
                (
                    n.kind,
                    n.perm,
                    n.uid,
                    n.gid,
                    n.nlink,
                    n.children.len() as u64,
                    n.target.clone(),
                ),
            );
            for (name, child) in &n.children {
                let mut p = path.clone();
                p.push(name.clone());
                if self.n(*child).kind == FileKind::Dir {
                    stack.push((p, *child));
                } else {
                    let c = self.n(*child);
                    out.insert(p, (c.kind, c.perm, c.uid, c.gid, c.nlink, 0, c.target.clone()));
                }
            }
        }
        out
    }
}

type Shape = (FileKind, u32, u32, u32, u32, u64, Option<Vec<u8>>);

fn engine_tree(ns: &Namespace) -> BTreeMap<Vec<Vec<u8>>, Shape> {
    let root = Creds::root();
    let mut out = BTreeMap::new();
    let mut stack = vec![(Vec::<Vec<u8>>::new(), Ino::ROOT)];
    while let Some((path, ino)) = stack.pop() {
        let a = ns.getattr(ino).expect("reachable inode has attributes");
        let entries = ns.readdir(&root, ino, None, 100_000).expect("readdir");
        assert_eq!(
            a.size,
            entries.len() as u64,
            "directory size is its entry count at {path:?}"
        );
        out.insert(
            path.clone(),
            (a.kind, a.perm, a.uid, a.gid, a.nlink, entries.len() as u64, None),
        );
        for e in entries {
            let mut p = path.clone();
            p.push(e.name.clone());
            let c = ns.getattr(e.ino).expect("entry's inode exists");
            assert_eq!(c.kind, e.kind, "entry kind matches its inode");
            if c.kind == FileKind::Dir {
                stack.push((p, e.ino));
            } else {
                let target = ns.readlink(e.ino).ok();
                let size = if c.kind == FileKind::Symlink { 0 } else { c.size };
                out.insert(p, (c.kind, c.perm, c.uid, c.gid, c.nlink, size, target));
            }
        }
    }
    out
}

// ---------------------------------------------------------------- random operations

use shingle_testkit::Rng;

#[derive(Clone, Debug)]
enum Op {
    Mk(Creds, Vec<Vec<u8>>, Vec<u8>, FileKind, u32),
    Unlink(Creds, Vec<Vec<u8>>, Vec<u8>),
    Rmdir(Creds, Vec<Vec<u8>>, Vec<u8>),
    Link(Creds, Vec<Vec<u8>>, Vec<Vec<u8>>, Vec<u8>),
    Rename(Creds, Vec<Vec<u8>>, Vec<u8>, Vec<Vec<u8>>, Vec<u8>, RenameFlags),
    Chmod(Creds, Vec<Vec<u8>>, u32),
}

fn ino_of(ns: &Namespace, path: &[Vec<u8>]) -> Option<Ino> {
    let root = Creds::root();
    let mut cur = Ino::ROOT;
    for c in path {
        cur = ns.lookup(&root, cur, c).ok()?.ino;
    }
    Some(cur)
}

/// Runs `op` as client operation `id`: a retry with the same id after a crash (the
/// answer was lost) must succeed once, not fail on the first try's effect.
fn run_engine(ns: &mut Namespace, op: &Op, id: u64, now: i64) -> Result<Answer, Errno> {
    let ino = |ns: &Namespace, p: &[Vec<u8>]| ino_of(ns, p).ok_or(Errno::ENOENT);
    let parts = ns.partition_count();
    let once = |ns: &mut Namespace,
                parent: Ino,
                name: &[u8],
                f: &mut dyn FnMut(&mut Namespace) -> Result<(), Errno>|
     -> Result<Answer, Errno> {
        let anchor = dentry_partition(parent, name, parts);
        Ok(match ns.once(id, anchor, now, |ns| f(ns))? {
            Some(()) => Answer::Ran,
            None => Answer::FromRecord,
        })
    };
    match op {
        Op::Mk(c, p, n, k, m) => {
            let target: Option<&[u8]> = (*k == FileKind::Symlink).then_some(b"target/x");
            let parent = ino(ns, p)?;
            // A create is made once by its token instead.
            ns.mknod_once(c, parent, n, *k, *m, 0, target, now, id, None)
                .map(|_| Answer::Ran)
        }
        Op::Unlink(c, p, n) => {
            let parent = ino(ns, p)?;
            once(ns, parent, n, &mut |ns| ns.unlink(c, parent, n, now))
        }
        Op::Rmdir(c, p, n) => {
            let parent = ino(ns, p)?;
            once(ns, parent, n, &mut |ns| ns.rmdir(c, parent, n, now))
        }
        Op::Link(c, t, p, n) => {
            let (target, parent) = (ino(ns, t)?, ino(ns, p)?);
            once(ns, parent, n, &mut |ns| ns.link(c, target, parent, n, now).map(|_| ()))
        }
        Op::Rename(c, p, n, np, nn, f) => {
            let (a, b) = (ino(ns, p)?, ino(ns, np)?);
            once(ns, b, nn, &mut |ns| ns.rename(c, a, n, b, nn, *f, now))
        }
        Op::Chmod(c, p, m) => {
            let i = ino(ns, p)?;
            ns.setattr(
                c,
                i,
                &SetAttr {
                    perm: Some(*m),
                    ..Default::default()
                },
                now,
            )
            .map(|_| Answer::Ran)
        }
    }
}

/// How the engine answered a successful operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answer {
    /// It ran.
    Ran,
    /// A retry of one already done: answered from its record.
    FromRecord,
}

fn run_model(m: &mut Model, op: &Op) -> Result<(), Errno> {
    let id = |m: &Model, p: &[Vec<u8>]| m.resolve(p).ok_or(Errno::ENOENT);
    match op {
        Op::Mk(c, p, n, k, mode) => {
            let target: Option<&[u8]> = (*k == FileKind::Symlink).then_some(b"target/x");
            let parent = id(m, p)?;
            m.mknod(c, parent, n, *k, *mode, target)
        }
        Op::Unlink(c, p, n) => {
            let parent = id(m, p)?;
            m.unlink(c, parent, n)
        }
        Op::Rmdir(c, p, n) => {
            let parent = id(m, p)?;
            m.rmdir(c, parent, n)
        }
        Op::Link(c, t, p, n) => {
            let (target, parent) = (id(m, t)?, id(m, p)?);
            m.link(c, target, parent, n)
        }
        Op::Rename(c, p, n, np, nn, f) => {
            let (a, b) = (id(m, p)?, id(m, np)?);
            m.rename(c, a, n, b, nn, *f)
        }
        Op::Chmod(c, p, mode) => {
            let i = id(m, p)?;
            m.chmod(c, i, *mode)
        }
    }
}

/// A path as its name components.
type Path = Vec<Vec<u8>>;

fn paths(m: &Model) -> (Vec<Path>, Vec<Path>) {
    let t = m.tree();
    let dirs = t
        .iter()
        .filter(|(_, s)| s.0 == FileKind::Dir)
        .map(|(p, _)| p.clone())
        .collect();
    let all = t.keys().cloned().collect();
    (dirs, all)
}

fn random_op(rng: &mut Rng, m: &Model) -> Op {
    let users = [
        Creds::root(),
        Creds {
            uid: 1000,
            gid: 1000,
            groups: vec![],
        },
        Creds {
            uid: 1001,
            gid: 1000,
            groups: vec![],
        },
    ];
    let names: [&[u8]; 5] = [b"a", b"b", b"c", b"dd", b"e"];
    let (dirs, all) = paths(m);
    let c = rng.pick(&users).clone();
    let dir = rng.pick(&dirs).clone();
    let name = rng.pick(&names).to_vec();
    match rng.below(100) {
        0..=24 => {
            let kinds = [
                FileKind::File,
                FileKind::Dir,
                FileKind::Dir,
                FileKind::Symlink,
                FileKind::Fifo,
            ];
            let modes = [0o755, 0o777, 0o700, 0o1777, 0o2775, 0o644];
            Op::Mk(c, dir, name, *rng.pick(&kinds), *rng.pick(&modes))
        }
        25..=34 => Op::Unlink(c, dir, name),
        35..=42 => Op::Rmdir(c, dir, name),
        43..=50 => Op::Link(c, rng.pick(&all).clone(), dir, name),
        51..=84 => {
            let f = match rng.below(6) {
                0 => RenameFlags {
                    noreplace: true,
                    exchange: false,
                },
                1 => RenameFlags {
                    noreplace: false,
                    exchange: true,
                },
                _ => RenameFlags::default(),
            };
            Op::Rename(c, dir, name, rng.pick(&dirs).clone(), rng.pick(&names).to_vec(), f)
        }
        _ => Op::Chmod(
            c,
            rng.pick(&all).clone(),
            *rng.pick(&[0o755, 0o700, 0o1777, 0o777, S_ISVTX | 0o755]),
        ),
    }
}

/// What one seed exercised.
#[derive(Default)]
struct Exercised {
    /// Crashed operations recovery redid.
    redone: usize,
    /// Retries answered from the record of their first try.
    from_record: usize,
}

/// Runs one seed. Every operation that crashed is retried, as a client whose answer was
/// lost does: it must then have been applied exactly once.
fn check_seed(seed: u64, partitions: u32, steps: usize) -> Exercised {
    let mut seen = Exercised::default();
    let mut rng = Rng::seeded(seed);
    let mut ns = Namespace::format(partitions, 1);
    let mut model = Model::new();
    // Let the users work in the root directory.
    ns.setattr(
        &Creds::root(),
        Ino::ROOT,
        &SetAttr {
            perm: Some(0o777),
            ..Default::default()
        },
        1,
    )
    .expect("chmod root");
    model.chmod(&Creds::root(), 0, 0o777).expect("chmod root");
    for step in 0..steps {
        let op = random_op(&mut rng, &model);
        let crash = rng.below(8) == 0;
        if crash {
            ns.crash_after(rng.below(4) as usize);
        }
        let before = model.clone();
        if std::env::var("SHINGLE_CHECK_EVERY_STEP").is_ok() {
            eprintln!("seed {seed} p {partitions} step {step} crash {crash}: {op:?}");
        }
        let want = run_model(&mut model, &op);
        let id = step as u64 + 1;
        let now = step as i64 + 2;
        let mut got = run_engine(&mut ns, &op, id, now);
        ns.clear_crash();
        if crash && got == Err(Errno::EIO) {
            // Crashed mid-operation: recovery must leave it fully applied or not at all.
            seen.redone += ns.recover();
            let t = engine_tree(&ns);
            assert!(
                t == model.tree() || t == before.tree(),
                "seed {seed} step {step}: half-applied {op:?}"
            );
            // The client retries (same id): applied exactly once, whichever it was.
            got = run_engine(&mut ns, &op, id, now);
            if got == Ok(Answer::FromRecord) {
                seen.from_record += 1;
            }
        }
        assert_eq!(got.map(|_| ()), want, "seed {seed} step {step}: {op:?}");
        if std::env::var("SHINGLE_CHECK_EVERY_STEP").is_ok() || step % 10 == 0 || step + 1 == steps {
            assert_eq!(
                engine_tree(&ns),
                model.tree(),
                "seed {seed} step {step}: trees differ after {op:?}"
            );
        }
        assert!(
            (0..partitions).all(|p| ns
                .partition(shingle_meta::ids::PartitionId(p))
                .is_some_and(|p| p.intents.is_empty())),
            "seed {seed} step {step}: intent left behind"
        );
    }
    seen
}

#[test]
fn engine_agrees_with_the_model() {
    let seeds: Vec<u64> = match std::env::var("SHINGLE_SEED") {
        Ok(s) => vec![s.parse().expect("SHINGLE_SEED is a number")],
        Err(_) => (1..=40).collect(),
    };
    let (mut redone, mut from_record) = (0, 0);
    let many = seeds.len() > 1;
    for seed in seeds {
        for partitions in [1, 7] {
            let seen = check_seed(seed, partitions, 300);
            redone += seen.redone;
            from_record += seen.from_record;
        }
    }
    assert!(
        !many || redone > 10,
        "crash recovery was hardly exercised ({redone} intents redone)"
    );
    assert!(
        !many || from_record > 10,
        "retries answered from their record were hardly exercised ({from_record})"
    );
}

/// A user whose group has its own id, in no other group.
fn user(uid: u32) -> Creds {
    Creds {
        uid,
        gid: uid,
        groups: vec![],
    }
}

#[test]
fn basic_operations_and_errors() {
    let mut ns = Namespace::format(16, 1);
    let root = Creds::root();
    let u = user(1000);
    let d = ns
        .mknod(&root, Ino::ROOT, b"d", FileKind::Dir, 0o777, 0, None, 2)
        .expect("mkdir");
    assert_eq!(ns.getattr(Ino::ROOT).expect("root").nlink, 3);
    let f = ns
        .mknod(&u, d.ino, b"f", FileKind::File, 0o644, 0, None, 3)
        .expect("create");
    assert_eq!(f.uid, 1000);
    assert_eq!(
        ns.mknod(&u, d.ino, b"f", FileKind::File, 0o644, 0, None, 3),
        Err(Errno::EEXIST)
    );
    assert_eq!(
        ns.mknod(&u, f.ino, b"x", FileKind::File, 0o644, 0, None, 3),
        Err(Errno::ENOTDIR)
    );
    assert_eq!(
        ns.mknod(&u, d.ino, &[b'n'; 256], FileKind::File, 0o644, 0, None, 3),
        Err(Errno::ENAMETOOLONG)
    );
    assert_eq!(
        ns.mknod(&u, d.ino, b"", FileKind::File, 0o644, 0, None, 3),
        Err(Errno::EINVAL)
    );
    let ro = ns
        .mknod(&root, Ino::ROOT, b"ro", FileKind::Dir, 0o755, 0, None, 3)
        .expect("mkdir");
    assert_eq!(
        ns.mknod(&u, ro.ino, b"x", FileKind::File, 0o644, 0, None, 3),
        Err(Errno::EACCES)
    );
    assert_eq!(ns.lookup(&u, d.ino, b"f").expect("lookup").ino, f.ino);
    assert_eq!(ns.lookup(&u, d.ino, b"missing"), Err(Errno::ENOENT));
    assert_eq!(ns.rmdir(&root, Ino::ROOT, b"d", 4), Err(Errno::ENOTEMPTY));
    assert_eq!(ns.unlink(&root, Ino::ROOT, b"d", 4), Err(Errno::EISDIR));
    assert_eq!(ns.rmdir(&root, d.ino, b"f", 4), Err(Errno::ENOTDIR));
    let s = ns
        .mknod(&u, d.ino, b"s", FileKind::Symlink, 0, 0, Some(b"f"), 5)
        .expect("symlink");
    assert_eq!(ns.readlink(s.ino).expect("readlink"), b"f");
    assert_eq!(ns.readlink(f.ino), Err(Errno::EINVAL));
    assert_eq!(
        ns.link(&u, f.ino, Ino::ROOT, b"hard", 6),
        Err(Errno::EACCES),
        "root directory is 0755"
    );
    ns.link(&u, f.ino, d.ino, b"hard", 6).expect("link");
    assert_eq!(ns.getattr(f.ino).expect("attr").nlink, 2);
    assert_eq!(ns.link(&u, d.ino, Ino::ROOT, b"dirlink", 6), Err(Errno::EPERM));
    ns.unlink(&u, d.ino, b"f", 7).expect("unlink");
    assert_eq!(ns.getattr(f.ino).expect("still linked").nlink, 1);
    ns.unlink(&u, d.ino, b"hard", 8).expect("unlink last");
    assert_eq!(ns.getattr(f.ino), Err(Errno::ENOENT));
    let names: Vec<_> = ns
        .readdir(&u, d.ino, None, 10)
        .expect("readdir")
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, vec![b"s".to_vec()]);
    // xattrs
    let g = ns
        .mknod(&u, d.ino, b"g", FileKind::File, 0o644, 0, None, 9)
        .expect("create");
    ns.setxattr(
        &u,
        g.ino,
        b"user.k",
        b"v",
        shingle_meta::namespace::XattrMode::Create,
        10,
    )
    .expect("setxattr");
    assert_eq!(
        ns.setxattr(
            &u,
            g.ino,
            b"user.k",
            b"v",
            shingle_meta::namespace::XattrMode::Create,
            10
        ),
        Err(Errno::EEXIST)
    );
    assert_eq!(
        ns.setxattr(
            &u,
            g.ino,
            b"user.z",
            b"v",
            shingle_meta::namespace::XattrMode::Replace,
            10
        ),
        Err(Errno::ENODATA)
    );
    assert_eq!(ns.getxattr(&u, g.ino, b"user.k").expect("get"), b"v");
    assert_eq!(ns.getxattr(&u, g.ino, b"user.none"), Err(Errno::ENODATA));
    assert_eq!(
        ns.setxattr(
            &u,
            g.ino,
            b"trusted.k",
            b"v",
            shingle_meta::namespace::XattrMode::Any,
            10
        ),
        Err(Errno::EPERM)
    );
    assert_eq!(
        ns.setxattr(&u, g.ino, b"weird.k", b"v", shingle_meta::namespace::XattrMode::Any, 10),
        Err(Errno::EOPNOTSUPP)
    );
    assert_eq!(ns.listxattr(&u, g.ino).expect("list"), vec![b"user.k".to_vec()]);
    ns.removexattr(&u, g.ino, b"user.k", 11).expect("remove");
    assert_eq!(ns.removexattr(&u, g.ino, b"user.k", 11), Err(Errno::ENODATA));
}

#[test]
fn readdir_pages_are_stable_and_complete() {
    let mut ns = Namespace::format(8, 1);
    let root = Creds::root();
    for i in 0..250 {
        ns.mknod(
            &root,
            Ino::ROOT,
            format!("f{i:03}").as_bytes(),
            FileKind::File,
            0o644,
            0,
            None,
            2,
        )
        .expect("create");
    }
    let mut seen = Vec::new();
    let mut after: Option<Vec<u8>> = None;
    loop {
        let page = ns.readdir(&root, Ino::ROOT, after.as_deref(), 32).expect("page");
        if page.is_empty() {
            break;
        }
        // Concurrent changes between pages: entries behind the cursor do not disturb it.
        ns.unlink(&root, Ino::ROOT, &page[0].name, 3)
            .expect("unlink seen entry");
        after = page.last().map(|e| e.name.clone());
        seen.extend(page.into_iter().map(|e| e.name));
    }
    assert_eq!(seen.len(), 250);
    let mut sorted = seen.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted, seen, "pages are in order without duplicates");
}

#[test]
fn an_acl_the_mode_expresses_sets_the_mode_and_others_are_refused() {
    use shingle_meta::namespace::XattrMode::Any;
    use shingle_meta::namespace::acl::{ACCESS, DEFAULT, of_mode};
    let mut ns = Namespace::format(4, 1);
    let root = Creds::root();
    let u = user(1000);
    let d = ns
        .mknod(&root, Ino::ROOT, b"d", FileKind::Dir, 0o777, 0, None, 1)
        .expect("mkdir");
    let f = ns
        .mknod(&u, d.ino, b"f", FileKind::File, 0o600, 0, None, 2)
        .expect("create");
    // What `cp -a` does after creating with the umask applied: the source's mode, as an ACL.
    ns.setxattr(&u, f.ino, ACCESS, &of_mode(0o664), Any, 3)
        .expect("set acl");
    let a = ns.getattr(f.ino).expect("attr");
    assert_eq!((a.perm & 0o7777, a.ctime), (0o664, 3));
    // Nothing is stored: Linux reads no ACL where the mode says it all.
    assert_eq!(ns.getxattr(&u, f.ino, ACCESS), Err(Errno::ENODATA));
    assert!(ns.listxattr(&u, f.ino).expect("list").is_empty());
    // The mode it has already: no change at all (not even ctime).
    ns.setxattr(&u, f.ino, ACCESS, &of_mode(0o664), Any, 4).expect("same");
    assert_eq!(ns.getattr(f.ino).expect("attr").ctime, 3);
    // Only the owner sets one; anyone may read (there is none).
    let other = user(1001);
    assert_eq!(
        ns.setxattr(&other, f.ino, ACCESS, &of_mode(0o777), Any, 5),
        Err(Errno::EPERM)
    );
    assert_eq!(ns.removexattr(&other, f.ino, ACCESS, 5), Err(Errno::EPERM));
    assert_eq!(ns.getxattr(&other, f.ino, ACCESS), Err(Errno::ENODATA));
    // Named users are not enforced, so not accepted; nor are malformed values.
    let named: Vec<u8> = [
        (0x01u16, 6u16, u32::MAX),
        (0x02, 6, 1001),
        (0x04, 4, u32::MAX),
        (0x10, 6, u32::MAX),
        (0x20, 0, u32::MAX),
    ]
    .iter()
    .fold(2u32.to_le_bytes().to_vec(), |mut v, (tag, perm, id)| {
        v.extend(
            tag.to_le_bytes()
                .into_iter()
                .chain(perm.to_le_bytes())
                .chain(id.to_le_bytes()),
        );
        v
    });
    assert_eq!(ns.setxattr(&u, f.ino, ACCESS, &named, Any, 6), Err(Errno::EOPNOTSUPP));
    assert_eq!(ns.setxattr(&u, f.ino, ACCESS, &named[..13], Any, 6), Err(Errno::EINVAL));
    assert_eq!(
        ns.getattr(f.ino).expect("attr").perm & 0o7777,
        0o664,
        "refusals change nothing"
    );
    // Removal succeeds (there is none to remove); default ACLs: not on files, not supported.
    ns.removexattr(&u, f.ino, ACCESS, 7).expect("remove");
    ns.removexattr(&root, d.ino, DEFAULT, 7).expect("remove default");
    assert_eq!(
        ns.setxattr(&u, f.ino, DEFAULT, &of_mode(0o644), Any, 7),
        Err(Errno::EACCES)
    );
    assert_eq!(
        ns.setxattr(&root, d.ino, DEFAULT, &of_mode(0o755), Any, 7),
        Err(Errno::EOPNOTSUPP)
    );
    // Set-group-id survives only for a member of the file's group, as with chmod.
    let g = ns
        .mknod(&root, d.ino, b"g", FileKind::File, 0o2745, 0, None, 8)
        .expect("create");
    let to_u = SetAttr {
        uid: Some(1000),
        ..SetAttr::default()
    };
    ns.setattr(&root, g.ino, &to_u, 8).expect("chown");
    assert_eq!(ns.getattr(g.ino).expect("attr").perm & 0o7777, 0o2745);
    ns.setxattr(&u, g.ino, ACCESS, &of_mode(0o740), Any, 9)
        .expect("set acl");
    assert_eq!(ns.getattr(g.ino).expect("attr").perm & 0o7777, 0o740, "not in group 0");
    let back = SetAttr {
        perm: Some(0o2745),
        ..SetAttr::default()
    };
    ns.setattr(&root, g.ino, &back, 9).expect("chmod");
    ns.setxattr(&root, g.ino, ACCESS, &of_mode(0o755), Any, 9)
        .expect("set acl");
    assert_eq!(ns.getattr(g.ino).expect("attr").perm & 0o7777, 0o2755, "root keeps it");
    // Symbolic links carry no ACL.
    let s = ns
        .mknod(&u, d.ino, b"s", FileKind::Symlink, 0o777, 0, Some(b"f"), 10)
        .expect("symlink");
    assert_eq!(
        ns.setxattr(&u, s.ino, ACCESS, &of_mode(0o700), Any, 11),
        Err(Errno::EOPNOTSUPP)
    );
}
