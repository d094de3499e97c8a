//! A create retried after its coordinator failed (the create was redone by the next
//! primary, so the entry exists) succeeds with its own inode instead of `EEXIST`.

use shingle_meta::ids::Ino;
use shingle_meta::namespace::Namespace;
use shingle_meta::namespace::types::{Creds, Errno, FileKind};

#[test]
fn a_retried_create_finds_its_own_inode_and_no_other() {
    let mut ns = Namespace::format(4, 1);
    let root = Creds::root();
    let mk =
        |ns: &mut Namespace, kind, token| ns.mknod_once(&root, Ino::ROOT, b"f", kind, 0o644, 0, None, 5, token, None);
    let first = mk(&mut ns, FileKind::File, 42).expect("create");
    let again = mk(&mut ns, FileKind::File, 42).expect("the retry of the same create");
    assert_eq!(again.ino, first.ino);
    assert_eq!(mk(&mut ns, FileKind::File, 43), Err(Errno::EEXIST), "another create");
    assert_eq!(
        mk(&mut ns, FileKind::File, 0),
        Err(Errno::EEXIST),
        "a create without a token"
    );
    assert_eq!(mk(&mut ns, FileKind::Dir, 42), Err(Errno::EEXIST), "another kind");
    // After the name went and came back as another file, the old token finds nothing.
    ns.unlink(&root, Ino::ROOT, b"f", 6).expect("unlink");
    let other = mk(&mut ns, FileKind::File, 44).expect("create");
    assert_ne!(other.ino, first.ino);
    assert_eq!(mk(&mut ns, FileKind::File, 42), Err(Errno::EEXIST));
}
