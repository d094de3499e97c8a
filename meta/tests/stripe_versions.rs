//! Stripe versions handed out by the namespace and compare-and-set commits: the rules
//! that make a stripe's committed version the one source of truth between writers.

use shingle_meta::ids::{Ino, NodeId};
use shingle_meta::namespace::types::{Creds, Errno, FileKind};
use shingle_meta::namespace::{Layout, Namespace, StripeRec, StripeWrite};

fn policy() -> Layout {
    Layout {
        k: 4,
        m: 2,
        unit: 1 << 20,
        ..Default::default()
    }
}

/// A size that reaches into stripe 1 (stripes of 4 MiB).
const TWO_STRIPES: u64 = (4 << 20) + 4096;

fn nodes(ids: &[u64]) -> Vec<Option<NodeId>> {
    ids.iter().map(|id| Some(NodeId(*id))).collect()
}

fn write(stripe: u64, base: u64, version: u64) -> StripeWrite {
    StripeWrite {
        stripe,
        base,
        rec: StripeRec {
            version,
            len: 4096,
            nodes: nodes(&[1, 2, 3, 4, 5, 6]),
        },
    }
}

fn file(ns: &mut Namespace) -> Ino {
    ns.mknod(&Creds::root(), Ino::ROOT, b"f", FileKind::File, 0o644, 0, None, 1)
        .expect("create")
        .ino
}

#[test]
fn reservations_never_overlap_and_only_grow() {
    let mut ns = Namespace::format(4, 1);
    let f = file(&mut ns);
    let a = ns.reserve_versions(f, &policy(), 10).expect("reserve");
    let b = ns.reserve_versions(f, &policy(), 5).expect("reserve");
    let c = ns.reserve_versions(f, &policy(), 1).expect("reserve");
    assert!(a >= 1);
    assert_eq!(b, a + 10);
    assert_eq!(c, b + 5);
    assert_eq!(ns.reserve_versions(f, &policy(), 0), Err(Errno::EINVAL));
    let bad = Layout { k: 0, ..policy() };
    assert_eq!(ns.reserve_versions(f, &bad, 4), Err(Errno::EINVAL));
    assert_eq!(ns.reserve_versions(Ino::ROOT, &policy(), 4), Err(Errno::EISDIR));
}

#[test]
fn a_create_hands_its_creator_the_first_versions() {
    let mut ns = Namespace::format(4, 1);
    let root = Creds::root();
    fn create(ns: &mut Namespace, name: &[u8], kind: FileKind, reserve: Option<(&Layout, u32)>) -> Result<Ino, Errno> {
        ns.mknod_once(&Creds::root(), Ino::ROOT, name, kind, 0o644, 0, None, 1, 7, reserve)
            .map(|a| a.ino)
    }
    let f = create(&mut ns, b"f", FileKind::File, Some((&policy(), 16))).expect("create");
    // Versions 1..=16 are the creator's: the next reservation starts above them, and
    // the file took the policy given (its directory has none).
    assert_eq!(ns.reserve_versions(f, &policy(), 4), Ok(17));
    assert_eq!(ns.layout(f).expect("layout").map(|l| (l.k, l.m)), Some((4, 2)));
    // A directory with a policy gives it to the file instead.
    let d = ns
        .mknod(&root, Ino::ROOT, b"d", FileKind::Dir, 0o755, 0, None, 1)
        .expect("mkdir")
        .ino;
    ns.set_layout(&root, d, &Layout { k: 2, ..policy() }, 1)
        .expect("set layout");
    let g = ns
        .mknod_once(
            &root,
            d,
            b"g",
            FileKind::File,
            0o644,
            0,
            None,
            1,
            8,
            Some((&policy(), 4)),
        )
        .expect("create")
        .ino;
    assert_eq!(
        ns.layout(g).expect("layout").map(|l| (l.k, l.next_version)),
        Some((2, 5))
    );
    // Out of range: too many, none, a bad policy, or a kind that holds no stripes.
    for (name, kind, count, p) in [
        (
            &b"a"[..],
            FileKind::File,
            shingle_meta::namespace::MAX_CREATE_RESERVE + 1,
            policy(),
        ),
        (b"b", FileKind::File, 0, policy()),
        (b"c", FileKind::File, 4, Layout { unit: 0, ..policy() }),
        (b"e", FileKind::Dir, 4, policy()),
    ] {
        assert_eq!(create(&mut ns, name, kind, Some((&p, count))), Err(Errno::EINVAL));
        assert!(ns.lookup(&root, Ino::ROOT, name).is_err(), "nothing made");
    }
}

#[test]
fn commits_are_compare_and_set_on_the_base_version() {
    let mut ns = Namespace::format(4, 1);
    let f = file(&mut ns);
    let v = ns.reserve_versions(f, &policy(), 100).expect("reserve");
    // Two writers both based their write of stripe 0 on "no stripe".
    ns.commit_write(f, &policy(), 4096, &[write(0, 0, v)], 3)
        .expect("first");
    assert_eq!(
        ns.commit_write(f, &policy(), 4096, &[write(0, 0, v + 1)], 4),
        Err(Errno::ESTALE),
        "the second writer must learn it lost"
    );
    // A retry of the commit that won is not a conflict.
    ns.commit_write(f, &policy(), 4096, &[write(0, 0, v)], 5)
        .expect("retry");
    // A failed commit changes nothing, not even the stripes that did match.
    assert_eq!(
        ns.commit_write(f, &policy(), TWO_STRIPES, &[write(1, 0, v + 2), write(0, 7, v + 3)], 6),
        Err(Errno::ESTALE)
    );
    let l = ns.layout(f).expect("layout").expect("a file layout");
    assert_eq!(l.stripes.len(), 1);
    assert_eq!(l.stripes[&0].version, v);
    // Based on the committed version, it applies.
    ns.commit_write(f, &policy(), TWO_STRIPES, &[write(0, v, v + 4), write(1, 0, v + 5)], 7)
        .expect("next");
    let l = ns.layout(f).expect("layout").expect("a file layout");
    assert_eq!((l.stripes[&0].version, l.stripes[&1].version), (v + 4, v + 5));
}

#[test]
fn commits_take_only_reserved_versions_and_valid_records() {
    let mut ns = Namespace::format(4, 1);
    let f = file(&mut ns);
    let v = ns.reserve_versions(f, &policy(), 2).expect("reserve");
    assert_eq!(
        ns.commit_write(f, &policy(), 1, &[write(0, 0, v + 2)], 3),
        Err(Errno::EINVAL),
        "never handed out"
    );
    assert_eq!(
        ns.commit_write(f, &policy(), 1, &[write(0, 0, 0)], 3),
        Err(Errno::EINVAL)
    );
    let mut big = write(0, 0, v);
    big.rec.len = 4 * (1 << 20) + 1;
    assert_eq!(ns.commit_write(f, &policy(), 1, &[big], 3), Err(Errno::EINVAL));
    let bad = Layout { unit: 0, ..policy() };
    assert_eq!(ns.commit_write(f, &bad, 1, &[write(0, 0, v)], 3), Err(Errno::EINVAL));
    ns.commit_write(f, &policy(), 1, &[write(0, 0, v)], 3).expect("valid");
}

/// What a hostile (authenticated) client could send in a commit or a relocation: every
/// field is refused before anything changes, so no reader of the file can be made to
/// index past a shard list or to meet a stripe beyond the end of the file.
#[test]
fn commits_and_relocations_refuse_out_of_range_fields() {
    let mut ns = Namespace::format(4, 1);
    let f = file(&mut ns);
    let v = ns.reserve_versions(f, &policy(), 8).expect("reserve");
    let mut long = write(0, 0, v);
    long.rec.nodes = nodes(&[1; 7]);
    assert_eq!(
        ns.commit_write(f, &policy(), 4096, &[long], 3),
        Err(Errno::EINVAL),
        "7 shards for 4+2"
    );
    assert_eq!(
        ns.commit_write(f, &policy(), 4096, &[write(1, 0, v)], 3),
        Err(Errno::EINVAL),
        "a stripe that starts past the size"
    );
    assert_eq!(
        ns.commit_write(f, &policy(), 4096, &[write(u64::MAX / 2, 0, v)], 3),
        Err(Errno::EINVAL),
        "a stripe whose offset overflows"
    );
    let huge = shingle_meta::namespace::MAX_FILE_BYTES + 1;
    assert_eq!(
        ns.commit_write(f, &policy(), huge, &[write(0, 0, v)], 3),
        Err(Errno::EINVAL)
    );
    assert_eq!(
        ns.layout(f).expect("layout").expect("layout").stripes.len(),
        0,
        "nothing applied"
    );

    ns.commit_write(f, &policy(), 4096, &[write(0, 0, v)], 3)
        .expect("valid");
    assert_eq!(
        ns.relocate_shards(f, 0, v, &[(6, 9)]),
        Err(Errno::EINVAL),
        "shard 6 of a 4+2 stripe"
    );
    assert_eq!(ns.relocate_shards(f, 0, v, &[(u32::MAX, 9)]), Err(Errno::EINVAL));
    assert_eq!(ns.relocate_shards(f, 0, v, &[(5, 9)]), Ok(true));
    let l = ns.layout(f).expect("layout").expect("layout");
    assert_eq!(l.stripes[&0].nodes, nodes(&[1, 2, 3, 4, 5, 9]));

    let set = shingle_meta::namespace::SetAttr {
        size: Some(huge),
        ..Default::default()
    };
    assert_eq!(ns.setattr(&Creds::root(), f, &set, 4), Err(Errno::EFBIG));
}

/// Policies the data nodes cannot store (no parity, a unit past their limit) are
/// refused by the metadata service too, and an inode's extended attributes have a
/// total bound, so no record grows past what a batch or a copy carries.
#[test]
fn policies_and_attributes_are_bounded() {
    use shingle_meta::namespace::XattrMode;
    let mut ns = Namespace::format(4, 1);
    let f = file(&mut ns);
    for bad in [
        Layout { m: 0, ..policy() },
        Layout {
            unit: shingle_meta::namespace::types::MAX_UNIT_BYTES + 4096,
            ..policy()
        },
    ] {
        assert_eq!(ns.reserve_versions(f, &bad, 1), Err(Errno::EINVAL), "{bad:?}");
        assert_eq!(ns.set_layout(&Creds::root(), f, &bad, 2), Err(Errno::EINVAL), "{bad:?}");
    }
    let value = vec![7u8; 60_000];
    let mut stored = 0;
    let refused = (0..10).find_map(|i| {
        let name = format!("user.a{i}");
        match ns.setxattr(&Creds::root(), f, name.as_bytes(), &value, XattrMode::Any, 3) {
            Ok(()) => {
                stored += 1;
                None
            }
            Err(e) => Some(e),
        }
    });
    assert_eq!(refused, Some(Errno::ENOSPC));
    assert_eq!(
        stored, 4,
        "four values of 60,000 bytes fit in 256 KiB, a fifth does not"
    );
    // Replacing a value with a smaller one still works at the limit.
    ns.setxattr(&Creds::root(), f, b"user.a0", b"small", XattrMode::Replace, 4)
        .expect("replace");
}

/// A commit on a coordinator's sparse view asks for the stripes it writes and nothing
/// else of the layout, and writes only those records: its cost does not grow with the
/// file. A truncate cuts the stripe records past the new size.
#[test]
fn commits_read_and_write_only_the_stripes_they_change() {
    use shingle_meta::namespace::{Mutation, Need};
    let mut ns = Namespace::format(4, 1);
    let f = file(&mut ns);
    let first = ns.reserve_versions(f, &policy(), 10_000).expect("reserve");
    let sb = 4u64 << 20;
    let big: Vec<StripeWrite> = (0..2_000).map(|s| write(s, 0, first + s)).collect();
    ns.commit_write(f, &policy(), 2_000 * sb, &big, 2).expect("commit");
    assert_eq!(ns.layout(f).expect("layout").expect("some").stripes.len(), 2_000);
    let part = ns.partition(f.partition()).expect("partition");
    let inode = part.inodes[&f].clone();
    assert!(
        inode.layout.as_ref().is_some_and(|l| l.stripes.is_empty()),
        "no stripes in the inode record"
    );

    // The coordinator's view: the inode, then exactly the stripes written.
    let one = [write(7, first + 7, first + 5_000)];
    let mut view = Namespace::sparse(4);
    view.provide_inode(f, Some(inode.clone()));
    assert_eq!(view.commit_write(f, &policy(), 2_000 * sb, &one, 3), Err(Errno::EAGAIN));
    assert_eq!(view.needs(), vec![Need::Stripe(f, 7)]);
    let mut view = Namespace::sparse(4);
    view.provide_inode(f, Some(inode.clone()));
    view.provide_stripe(f, 7, part.stripes.get(&(f, 7)).cloned());
    view.commit_write(f, &policy(), 2_000 * sb, &one, 3).expect("commit");
    let plans = view.take_plans();
    assert_eq!(plans.len(), 1);
    let steps = &plans[0].1;
    assert_eq!(steps.len(), 2, "{steps:?}");
    match &steps[0].1 {
        Mutation::PutInode(r) => assert!(r.layout.as_ref().is_some_and(|l| l.stripes.is_empty())),
        m => panic!("{m:?}"),
    }
    match &steps[1].1 {
        Mutation::PutStripes { ino, stripes } => {
            assert_eq!(*ino, f);
            assert_eq!(stripes.len(), 1);
            assert_eq!(stripes[0].0, 7);
        }
        m => panic!("{m:?}"),
    }
    // A stale base is still refused on the sparse view.
    let mut view = Namespace::sparse(4);
    view.provide_inode(f, Some(inode));
    view.provide_stripe(f, 7, part.stripes.get(&(f, 7)).cloned());
    let stale = [write(7, first + 1, first + 5_001)];
    assert_eq!(
        view.commit_write(f, &policy(), 2_000 * sb, &stale, 3),
        Err(Errno::ESTALE)
    );

    // Truncating to 10 stripes and a bit keeps stripes 0..=10 only.
    let set = shingle_meta::namespace::SetAttr {
        size: Some(10 * sb + 1),
        ..Default::default()
    };
    ns.setattr(&Creds::root(), f, &set, 4).expect("truncate");
    let l = ns.layout(f).expect("layout").expect("some");
    assert_eq!(
        l.stripes.keys().copied().collect::<Vec<_>>(),
        (0..=10).collect::<Vec<_>>()
    );
    // Removing the file removes every stripe record with it.
    ns.unlink(&Creds::root(), Ino::ROOT, b"f", 5).expect("unlink");
    let part = ns.partition(f.partition()).expect("partition");
    assert!(part.stripes.is_empty(), "{} stripe records left", part.stripes.len());
}

/// A policy may change only while the file holds no data (size 0).
#[test]
fn a_file_with_data_keeps_its_policy() {
    let mut ns = Namespace::format(4, 1);
    let f = file(&mut ns);
    let other = Layout { k: 2, ..policy() };
    ns.set_layout(&Creds::root(), f, &other, 2).expect("empty file");
    let v = ns
        .reserve_versions(f, &policy(), 4)
        .expect("the writer's policy while empty");
    ns.commit_write(f, &policy(), 4096, &[write(0, 0, v)], 3)
        .expect("commit");
    assert_eq!(ns.set_layout(&Creds::root(), f, &other, 4), Err(Errno::EBUSY));
    assert_eq!(ns.reserve_versions(f, &other, 4), Err(Errno::EINVAL));
    // Truncated to zero, it holds nothing and may take another policy.
    let set = shingle_meta::namespace::SetAttr {
        size: Some(0),
        ..Default::default()
    };
    ns.setattr(&Creds::root(), f, &set, 5).expect("truncate");
    ns.set_layout(&Creds::root(), f, &other, 6).expect("empty again");
}
