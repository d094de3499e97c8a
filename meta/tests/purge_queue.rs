//! Removed files queue their data for a purge: the rule that makes space come back.
//! A file's purge is queued when its last link goes (unlink or rename over it), waits
//! at least `PURGE_DELAY_NS`, can be held by a client that still has it open, and is
//! forgotten once its data is deleted.

use shingle_meta::ids::Ino;
use shingle_meta::namespace::types::{Creds, FileKind};
use shingle_meta::namespace::{Namespace, PURGE_DELAY_NS, Purge, RenameFlags};
use shingle_meta::service::replica::{Key, Replica};

fn purges(ns: &Namespace, ino: Ino) -> Option<Purge> {
    ns.partition(ino.partition())?.purges.get(&ino).copied()
}

fn create(ns: &mut Namespace, name: &[u8], kind: FileKind) -> Ino {
    let target = (kind == FileKind::Symlink).then_some(&b"t"[..]);
    ns.mknod(&Creds::root(), Ino::ROOT, name, kind, 0o644, 0, target, 1)
        .expect("create")
        .ino
}

#[test]
fn the_last_link_queues_a_purge_that_holds_move_and_purged_forgets() {
    let mut ns = Namespace::format(4, 1);
    let root = Creds::root();
    let f = create(&mut ns, b"f", FileKind::File);
    ns.link(&root, f, Ino::ROOT, b"g", 2).expect("link");
    ns.unlink(&root, Ino::ROOT, b"f", 10).expect("unlink");
    assert_eq!(purges(&ns, f), None, "a link is left: nothing to purge");
    ns.unlink(&root, Ino::ROOT, b"g", 20).expect("unlink");
    assert_eq!(
        purges(&ns, f),
        Some(Purge {
            since: 20,
            held_until: 20 + PURGE_DELAY_NS
        })
    );
    ns.hold_purge(f, 1_000).expect("hold");
    assert_eq!(purges(&ns, f).map(|p| p.held_until), Some(1_000));
    ns.purged(f).expect("purged");
    assert_eq!(purges(&ns, f), None);
    // Holding a file that waits for nothing changes nothing.
    ns.hold_purge(f, 5).expect("hold");
    assert_eq!(purges(&ns, f), None);
}

#[test]
fn rename_over_a_file_queues_it_and_only_regular_files_are_queued() {
    let mut ns = Namespace::format(4, 1);
    let root = Creds::root();
    let a = create(&mut ns, b"a", FileKind::File);
    let b = create(&mut ns, b"b", FileKind::File);
    ns.rename(&root, Ino::ROOT, b"a", Ino::ROOT, b"b", RenameFlags::default(), 7)
        .expect("rename");
    assert!(purges(&ns, b).is_some(), "the replaced file's data goes");
    assert!(purges(&ns, a).is_none());
    let l = create(&mut ns, b"l", FileKind::Symlink);
    ns.unlink(&root, Ino::ROOT, b"l", 8).expect("unlink");
    assert!(purges(&ns, l).is_none(), "a symlink has no data");
}

#[test]
fn a_replica_persists_and_restores_its_purges() {
    let mut ns = Namespace::format(4, 1);
    let f = create(&mut ns, b"f", FileKind::File);
    ns.unlink(&Creds::root(), Ino::ROOT, b"f", 3).expect("unlink");
    let p = f.partition();
    let mut r = Replica::initial(p, 4, 1);
    r.part = ns.partition(p).expect("partition").clone();
    let values = r.all_values();
    assert!(values.iter().any(|(k, _)| *k == Key::Purge(f)));
    let mut back = Replica::initial(p, 4, 1);
    back.part.purges.clear();
    for (k, v) in values {
        let enc = k.encode(p);
        let (q, key) = Key::decode(&enc).expect("decodes");
        assert_eq!(q, p);
        back.restore(key, &v).expect("restore");
    }
    assert_eq!(back.part.purges, r.part.purges);
}
