//! Real-mount tests: `shingle dev` (six real node processes and a FUSE mount) driven
//! through the kernel with ordinary file calls and shell processes.

// A scenario test reads top to bottom as the steps it runs (clippy.toml).
#![allow(clippy::too_many_lines)]

mod common;

use common::{DevMount, SecondMount, pattern};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

/// The dev cluster these tests mount: 48 zones per node.
fn start_dev(data: &Path, mount: &Path) -> DevMount {
    DevMount::start(data, mount, &["--zones", "48"], |_| {})
}

fn crc_file(p: &Path) -> (u64, u32) {
    let mut f = std::fs::File::open(p).expect("open");
    let mut buf = vec![0u8; 1 << 20];
    let (mut n, mut h) = (0u64, 0u32);
    loop {
        let r = f.read(&mut buf).expect("read");
        if r == 0 {
            return (n, h);
        }
        h = crc32c::crc32c_append(h, &buf[..r]);
        n += r as u64;
    }
}

#[test]
fn tree_permissions_concurrency_big_files_and_remount() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (data, mnt) = (tmp.path().join("data"), tmp.path().join("mnt"));
    let mut dev = start_dev(&data, &mnt);

    // A tree of directories and files of many sizes (holes, partial and full stripes).
    let sizes = [0usize, 1, 4095, 4096, 65_537, 1 << 20, (4 << 20) + 3, 9 << 20];
    let mut expect = Vec::new();
    for d in 0..3 {
        let dir = dev.path(&format!("tree/d{d}/sub"));
        std::fs::create_dir_all(&dir).expect("mkdir -p");
        for (i, &len) in sizes.iter().enumerate() {
            let p = dir.join(format!("f{i}"));
            let content = pattern((d * 100 + i) as u64, len);
            std::fs::write(&p, &content).expect("write");
            expect.push((p, content));
        }
    }
    for (p, content) in &expect {
        assert_eq!(&std::fs::read(p).expect("read back"), content, "{}", p.display());
        assert_eq!(std::fs::metadata(p).expect("stat").len(), content.len() as u64);
    }
    // Times and mode set through a descriptor before it closes are what the file keeps
    // (cp -a does that): its buffered writes are committed before the change, not after.
    let preserved = dev.path("tree/preserved");
    let when = std::time::UNIX_EPOCH + Duration::from_secs(1_600_000_000);
    {
        let mut f = std::fs::File::create(&preserved).expect("create");
        f.write_all(b"written before the times are set").expect("write");
        f.set_times(std::fs::FileTimes::new().set_modified(when).set_accessed(when))
            .expect("futimens");
        f.set_permissions(std::fs::Permissions::from_mode(0o4755))
            .expect("fchmod");
    }
    // Past the attribute TTL: what the cluster holds, not the kernel's copy.
    std::thread::sleep(Duration::from_millis(1500));
    let m = std::fs::metadata(&preserved).expect("stat");
    assert_eq!(
        m.modified().expect("mtime"),
        when,
        "the close moved the mtime set before it"
    );
    assert_eq!(m.permissions().mode() & 0o7777, 0o4755, "the close cleared set-user-id");
    assert_eq!(
        std::fs::read(&preserved).expect("read"),
        b"written before the times are set"
    );
    std::fs::remove_file(&preserved).expect("rm");
    let mut names: Vec<String> = std::fs::read_dir(dev.path("tree/d1/sub"))
        .expect("readdir")
        .map(|e| e.expect("entry").file_name().into_string().expect("utf8"))
        .collect();
    names.sort();
    assert_eq!(names, (0..sizes.len()).map(|i| format!("f{i}")).collect::<Vec<_>>());

    // Overwrite in the middle of a stripe, then extend past the end with a hole.
    let p = dev.path("tree/d0/sub/f6");
    let mut f = std::fs::OpenOptions::new().write(true).open(&p).expect("open rw");
    f.seek(SeekFrom::Start(1_000_000)).expect("seek");
    f.write_all(b"MIDDLE").expect("write middle");
    f.seek(SeekFrom::Start(20 << 20)).expect("seek");
    f.write_all(b"END").expect("write end");
    drop(f);
    let mut want = pattern(6, (4 << 20) + 3);
    want[1_000_000..1_000_006].copy_from_slice(b"MIDDLE");
    want.resize(20 << 20, 0);
    want.extend_from_slice(b"END");
    assert_eq!(std::fs::read(&p).expect("read"), want);
    // Truncate down into a stripe and extend again: the cut part reads as zeros.
    let f = std::fs::OpenOptions::new().write(true).open(&p).expect("open");
    f.set_len(500_000).expect("truncate");
    f.set_len(600_000).expect("extend");
    drop(f);
    let got = std::fs::read(&p).expect("read");
    assert_eq!(&got[..500_000], &want[..500_000]);
    assert!(got[500_000..].iter().all(|b| *b == 0), "extension reads zeros");

    // Errors as a local filesystem gives them.
    let err = |r: std::io::Result<()>| r.expect_err("must fail").raw_os_error();
    assert_eq!(err(std::fs::create_dir(dev.path("tree"))), Some(libc::EEXIST));
    assert_eq!(err(std::fs::remove_dir(dev.path("tree/d0"))), Some(libc::ENOTEMPTY));
    assert_eq!(err(std::fs::remove_file(dev.path("tree/nope"))), Some(libc::ENOENT));
    assert_eq!(
        err(std::fs::remove_dir(dev.path("tree/d0/sub/f1"))),
        Some(libc::ENOTDIR)
    );
    let long = "x".repeat(256);
    assert_eq!(err(std::fs::write(dev.path(&long), b"")), Some(libc::ENAMETOOLONG));
    std::os::unix::fs::symlink("d0/sub/f1", dev.path("tree/link")).expect("symlink");
    assert_eq!(
        std::fs::read(dev.path("tree/link")).expect("via symlink"),
        pattern(1, 1)
    );
    std::fs::hard_link(dev.path("tree/d0/sub/f2"), dev.path("tree/hard")).expect("link");
    assert_eq!(std::fs::metadata(dev.path("tree/hard")).expect("stat").nlink(), 2);

    // Permissions as a non-root user.
    std::fs::create_dir(dev.path("open")).expect("mkdir");
    std::fs::set_permissions(dev.path("open"), std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let as_user = |script: &str| {
        Command::new("sh")
            .arg("-c")
            .arg(script)
            .uid(1000)
            .gid(1000)
            .output()
            .expect("run as uid 1000")
    };
    let o = as_user(&format!("touch {}/tree/denied", mnt.display()));
    assert!(!o.status.success(), "uid 1000 must not create in a root 0755 dir");
    assert!(String::from_utf8_lossy(&o.stderr).contains("Permission denied"));
    let o = as_user(&format!(
        "echo mine > {0}/open/mine && cat {0}/open/mine",
        mnt.display()
    ));
    assert!(o.status.success(), "uid 1000 writes in a 0777 dir: {o:?}");
    assert_eq!(std::fs::metadata(dev.path("open/mine")).expect("stat").uid(), 1000);
    let o = as_user(&format!("cat {}/tree/d0/sub/f1 > /dev/null", mnt.display()));
    assert!(o.status.success(), "0644 files are readable by others");
    std::fs::set_permissions(dev.path("tree/d0/sub/f1"), std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let o = as_user(&format!("cat {}/tree/d0/sub/f1", mnt.display()));
    assert!(!o.status.success(), "0600 root file is not readable by uid 1000");

    // Rename and replace under concurrent readers (threads) and writers (processes):
    // a reader sees a whole old or a whole new file, never a mix.
    std::fs::create_dir(dev.path("swap")).expect("mkdir");
    for i in 0..4 {
        std::fs::write(dev.path(&format!("swap/f{i}")), format!("v0-{}\n", "x".repeat(3000))).expect("seed");
    }
    let writers: Vec<Child> = (0..2)
        .map(|w| {
            Command::new("sh")
                .arg("-c")
                .arg(format!(
                    "for i in $(seq 1 25); do printf 'v{w}%s-%s\\n' $i $(printf '%3000s' '' | tr ' ' x) > {m}/swap/t{w}-$i && mv {m}/swap/t{w}-$i {m}/swap/f$((i % 4)) || exit 1; done",
                    m = mnt.display()
                ))
                .spawn()
                .expect("writer")
        })
        .collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..3)
        .map(|r| {
            let (m, stop) = (mnt.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut reads = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let p = m.join(format!("swap/f{}", (reads + r) % 4));
                    if let Ok(s) = std::fs::read_to_string(&p) {
                        assert!(
                            s.ends_with(&format!("-{}\n", "x".repeat(3000))),
                            "torn read of {}: {} bytes",
                            p.display(),
                            s.len()
                        );
                        reads += 1;
                    }
                }
                reads
            })
        })
        .collect();
    for mut w in writers {
        assert!(w.wait().expect("writer").success(), "writer failed");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for r in readers {
        assert!(r.join().expect("reader") > 0);
    }
    let left = std::fs::read_dir(dev.path("swap")).expect("readdir").count();
    assert_eq!(left, 4, "only the four targets remain");

    // A dense 1 GiB file and a sparse one.
    let big = dev.path("big-dense");
    {
        let mut f = std::fs::File::create(&big).expect("create");
        let block = pattern(77, 4 << 20);
        for i in 0..256u32 {
            let mut b = block.clone();
            b[..4].copy_from_slice(&i.to_le_bytes());
            f.write_all(&b).expect("write 1 GiB");
        }
        f.sync_all().expect("fsync");
    }
    let dense = crc_file(&big);
    assert_eq!(dense.0, 1 << 30);
    let sparse = dev.path("big-sparse");
    {
        let mut f = std::fs::File::create(&sparse).expect("create");
        f.seek(SeekFrom::Start((1 << 30) - 5)).expect("seek");
        f.write_all(b"tail!").expect("write");
    }
    let mut f = std::fs::File::open(&sparse).expect("open");
    assert_eq!(f.metadata().expect("stat").len(), 1 << 30);
    let mut head = vec![1u8; 1 << 20];
    f.read_exact(&mut head).expect("read head");
    assert!(head.iter().all(|b| *b == 0), "a hole reads as zeros");
    f.seek(SeekFrom::Start((1 << 30) - 5)).expect("seek");
    let mut tail = Vec::new();
    f.read_to_end(&mut tail).expect("read tail");
    assert_eq!(tail, b"tail!");
    drop(f);

    // Unmount (Ctrl-C) and mount again: the same data.
    let before: Vec<(PathBuf, (u64, u32))> = expect.iter().map(|(p, _)| (p.clone(), crc_file(p))).collect();
    dev.stop(Duration::from_secs(60));
    let dev = start_dev(&data, &mnt);
    for (p, sum) in &before {
        assert_eq!(&crc_file(p), sum, "{} changed across remount", p.display());
    }
    assert_eq!(crc_file(&dev.path("big-dense")), dense);
    assert_eq!(std::fs::read_to_string(dev.path("open/mine")).expect("read"), "mine\n");
    drop(dev);

    // Nothing above went wrong for the cluster (refused permissions are the callers'
    // errors): no node logged a warning or an error.
    let mut bad = Vec::new();
    for i in 1..=6 {
        let log = std::fs::read_to_string(data.join(format!("node{i}.log"))).unwrap_or_default();
        bad.extend(
            log.lines()
                .filter(|l| {
                    l.contains(" WARN ") || l.contains(" ERROR ") || l.contains("WARN\x1b") || l.contains("ERROR\x1b")
                })
                .map(|l| format!("node{i}: {l}")),
        );
    }
    assert!(
        bad.is_empty(),
        "a healthy run logged warnings or errors:\n{}",
        bad.join("\n")
    );
}

/// Two mounts of one cluster on one file: what one closes, the other sees at its next
/// open (close-to-open, both ways, files of several stripes); a reader on one mount gets
/// the old or the new bytes of each stripe — never an error — while the other mount
/// rewrites the file and closes it again and again.
#[test]
fn two_mounts_see_each_others_closes_and_readers_never_fail() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (data, mnt) = (tmp.path().join("data"), tmp.path().join("mnt"));
    let dev = start_dev(&data, &mnt);
    let second = SecondMount::start(&data, &tmp.path().join("mnt2"));
    let (a, b) = (dev.path("shared.bin"), second.mount.join("shared.bin"));
    for round in 0..6u64 {
        let len = 100_000 + (round as usize) * 2_000_000;
        let (from, to) = if round % 2 == 0 { (&a, &b) } else { (&b, &a) };
        let data = pattern(round, len);
        std::fs::write(from, &data).expect("write on one mount");
        let got = std::fs::read(to).expect("read on the other");
        assert!(
            got == data,
            "round {round}: {} bytes read, {} written",
            got.len(),
            data.len()
        );
    }
    // Fixed size, every stripe rewritten with one byte value per round.
    let len = 9 << 20;
    std::fs::write(&a, vec![1u8; len]).expect("first version");
    let writer = {
        let a = a.clone();
        std::thread::spawn(move || {
            for v in 2..10u8 {
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&a)
                    .expect("open for rewrite");
                f.write_all(&vec![v; len]).expect("rewrite");
                f.sync_all().expect("fsync");
            }
        })
    };
    let mut reads = 0;
    while !writer.is_finished() || reads < 10 {
        let mut f = std::fs::File::open(&b).expect("open on the reader's mount");
        let mut buf = vec![0u8; 64 << 10];
        let off = (reads * 1_234_567) % (len as u64 - buf.len() as u64);
        f.seek(SeekFrom::Start(off)).expect("seek");
        f.read_exact(&mut buf).expect("a reader must never see an error");
        // Old or new bytes, never zeros or anything else (the kernel may split one read
        // into requests on either side of a commit, so versions can mix across them).
        assert!(buf.iter().all(|x| (1..=9).contains(x)), "bytes of no version at {off}");
        reads += 1;
        assert!(reads < 5_000, "the writer did not finish");
    }
    writer.join().expect("writer");
    assert!(std::fs::read(&b).expect("final read").iter().all(|x| *x == 9));
    drop(second);
}

/// A lookup that finds nothing is remembered for the mount's negative TTL: a name
/// created through another client stays hidden that long, one created (or renamed into
/// place) through this mount is there at once, and a TTL of 0 asks every time. A
/// missing extended attribute likewise, for the attribute TTL.
#[test]
fn missing_names_and_xattrs_are_remembered_for_their_ttl_only() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (data, mnt) = (tmp.path().join("data"), tmp.path().join("mnt"));
    let dev = start_dev(&data, &mnt);
    let remembering = SecondMount::with_args(&data, &tmp.path().join("mnt2"), &["--negative-ttl", "30"]);
    let asking = SecondMount::with_args(&data, &tmp.path().join("mnt3"), &["--negative-ttl", "0"]);
    let missing = |m: &Path, name: &str| matches!(std::fs::metadata(m.join(name)), Err(e) if e.kind() == std::io::ErrorKind::NotFound);
    std::fs::create_dir(dev.path("neg")).expect("mkdir");
    let (r, q) = (remembering.mount.join("neg"), asking.mount.join("neg"));
    assert!(missing(&r, "late") && missing(&q, "late"));
    std::fs::write(dev.path("neg/late"), b"x").expect("create through the first mount");
    assert!(missing(&r, "late"), "the negative entry is kept for its 30 s");
    assert_eq!(std::fs::read(q.join("late")).expect("TTL 0 asks again"), b"x");
    // Through the remembering mount itself: at once, by create and by rename.
    assert!(missing(&r, "mine") && missing(&r, "moved"));
    std::fs::write(r.join("mine"), b"y").expect("create where it was missing");
    assert_eq!(std::fs::read(r.join("mine")).expect("read back"), b"y");
    std::fs::rename(r.join("mine"), r.join("moved")).expect("rename into a missing name");
    assert!(missing(&r, "mine"), "the old name is gone");
    assert_eq!(std::fs::read(r.join("moved")).expect("the new name"), b"y");

    // Extended attributes found missing are remembered the same way (the kernel asks
    // for security.capability before every write): set or removed here, seen at once.
    let f = dev.path("neg/late");
    for _ in 0..3 {
        assert_eq!(getxattr(&f, "user.k"), Err(libc::ENODATA));
        std::fs::OpenOptions::new()
            .append(true)
            .open(&f)
            .and_then(|mut h| h.write_all(b"more"))
            .expect("write");
    }
    setxattr(&f, "user.k", b"v1");
    assert_eq!(getxattr(&f, "user.k"), Ok(b"v1".to_vec()));
    removexattr(&f, "user.k");
    assert_eq!(getxattr(&f, "user.k"), Err(libc::ENODATA));
    setxattr(&f, "user.k", b"v2");
    assert_eq!(getxattr(&f, "user.k"), Ok(b"v2".to_vec()));
    own_changes_show_in_the_directory_as_the_service_has_them(&dev, &asking.mount);
    drop((remembering, asking));
    acls_the_mode_expresses_are_the_mode(&dev, tmp.path());
}

/// A directory this mount changes is re-read by the kernel after each change, and the
/// mount answers from what it read with its changes applied (decision 0031): what it
/// answers is what another mount reads from the service — entries, links and times.
fn own_changes_show_in_the_directory_as_the_service_has_them(dev: &DevMount, other: &Path) {
    std::fs::create_dir(dev.path("own")).expect("mkdir");
    let shape = |p: &Path| {
        let m = std::fs::metadata(p).expect("stat");
        (
            m.size(),
            m.nlink(),
            m.mtime(),
            m.mtime_nsec(),
            m.ctime(),
            m.ctime_nsec(),
        )
    };
    let before = shape(&dev.path("own"));
    for i in 0..5 {
        std::fs::write(dev.path(&format!("own/f{i}")), b"x").expect("create");
    }
    std::fs::create_dir(dev.path("own/sub1")).expect("mkdir");
    std::fs::create_dir(dev.path("own/sub2")).expect("mkdir");
    std::fs::hard_link(dev.path("own/f0"), dev.path("own/link")).expect("link");
    std::fs::remove_file(dev.path("own/f1")).expect("unlink");
    let here = shape(&dev.path("own"));
    assert_eq!(
        (here.0, here.1),
        (7, 4),
        "5 files + 2 dirs + a link - 1; 2 + 2 subdirectories"
    );
    assert!((here.2, here.3) > (before.2, before.3), "the changes moved mtime");
    // The other mount reads the service, where a directory's counts follow the
    // answer (decision 0023: it may see them a moment late, then keeps what it saw for
    // its TTL): it comes to the same attributes, and this mount keeps them meanwhile.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let mut there = shape(&other.join("own"));
    while there != here && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        there = shape(&other.join("own"));
    }
    assert_eq!(here, there, "as the service has it");
    assert_eq!(shape(&dev.path("own")), here);
}

/// An access ACL with only owner, group and other entries is the mode (decision 0030):
/// a reader it lets in gets in at once (the kernel drops the attributes it cached
/// after a setxattr); `cp -a` keeps the modes the umask took off at create; none is
/// stored; ACLs naming users are refused, not ignored.
fn acls_the_mode_expresses_are_the_mode(dev: &DevMount, tmp: &Path) {
    use shingle_meta::namespace::acl::{ACCESS, of_mode};
    let access = std::str::from_utf8(ACCESS).expect("ascii");
    // The test's directory is 0700; nobody has to reach the mount.
    std::fs::set_permissions(tmp, std::fs::Permissions::from_mode(0o755)).expect("chmod tmp");
    std::fs::create_dir(dev.path("acl")).expect("mkdir");
    let secret = dev.path("acl/secret");
    std::fs::write(&secret, b"s").expect("create");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let nobody_reads = || {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "cat"])
            .arg(&secret)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .expect("setpriv")
            .success()
    };
    assert!(!nobody_reads(), "0600 keeps nobody out (and the kernel caches 0600)");
    setxattr(&secret, access, &of_mode(0o644));
    assert!(nobody_reads(), "the ACL's mode lets nobody in at once");
    let md = std::fs::metadata(&secret).expect("stat");
    assert_eq!(md.mode() & 0o7777, 0o644);
    assert_eq!(getxattr(&secret, access), Err(libc::ENODATA), "nothing stored");
    // A named user (1001: rw) with its mask: not enforced, so refused.
    let mut named = of_mode(0o640);
    named.splice(12..12, [2, 0, 6, 0, 0xe9, 3, 0, 0]);
    named.splice(
        28..,
        [
            0x10, 0, 6, 0, 0xff, 0xff, 0xff, 0xff, 0x20, 0, 0, 0, 0xff, 0xff, 0xff, 0xff,
        ],
    );
    assert_eq!(try_setxattr(&secret, access, &named), Err(libc::EOPNOTSUPP));
    assert_eq!(std::fs::metadata(&secret).expect("stat").mode() & 0o7777, 0o644);

    // cp -a of a directory and a file whose modes the umask (022) would cut.
    let src = tmp.join("acl-src");
    std::fs::create_dir_all(src.join("open")).expect("mkdir src");
    std::fs::write(src.join("open/shared"), b"x").expect("write src");
    std::fs::set_permissions(src.join("open/shared"), std::fs::Permissions::from_mode(0o666)).expect("chmod");
    std::fs::set_permissions(src.join("open"), std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let st = Command::new("cp")
        .arg("-a")
        .arg(&src)
        .arg(dev.path("acl/copy"))
        .status()
        .expect("cp");
    assert!(st.success(), "cp -a: {st}");
    for (p, want) in [("acl/copy/open", 0o777), ("acl/copy/open/shared", 0o666)] {
        assert_eq!(
            std::fs::metadata(dev.path(p)).expect("stat").mode() & 0o7777,
            want,
            "{p}"
        );
    }
}

fn c_path(p: &Path) -> std::ffi::CString {
    std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).expect("path without NUL")
}

/// An extended attribute's value, or the errno.
fn getxattr(p: &Path, name: &str) -> Result<Vec<u8>, i32> {
    let (path, name) = (c_path(p), std::ffi::CString::new(name).expect("name"));
    let mut buf = vec![0u8; 256];
    // SAFETY: both strings are NUL-terminated and live; the buffer is writable for its length.
    #[allow(unsafe_code)]
    let n = unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
    }
    buf.truncate(n as usize);
    Ok(buf)
}

fn setxattr(p: &Path, name: &str, value: &[u8]) {
    if let Err(e) = try_setxattr(p, name, value) {
        panic!("setxattr {name}: {}", std::io::Error::from_raw_os_error(e));
    }
}

fn try_setxattr(p: &Path, name: &str, value: &[u8]) -> Result<(), i32> {
    let (path, name) = (c_path(p), std::ffi::CString::new(name).expect("name"));
    // SAFETY: both strings are NUL-terminated and live; the value is readable for its length.
    #[allow(unsafe_code)]
    let r = unsafe { libc::setxattr(path.as_ptr(), name.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    }
}

fn removexattr(p: &Path, name: &str) {
    let (path, name) = (c_path(p), std::ffi::CString::new(name).expect("name"));
    // SAFETY: both strings are NUL-terminated and live.
    #[allow(unsafe_code)]
    let r = unsafe { libc::removexattr(path.as_ptr(), name.as_ptr()) };
    assert_eq!(r, 0, "removexattr: {}", std::io::Error::last_os_error());
}

/// `shingle_fs_op_seconds_count` of `op` from a mount's `/metrics` at `addr`.
fn fs_ops(addr: std::net::SocketAddr, op: &str) -> f64 {
    use std::net::TcpStream;
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).expect("connect to /metrics");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    write!(s, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").expect("ask");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read /metrics");
    let needle = format!("shingle_fs_op_seconds_count{{op=\"{op}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&needle))
        .map_or(0.0, |v| v.trim().parse().expect("a count"))
}

/// A listing carries its entries' attributes (READDIRPLUS): `ls -l` and `rm -rf`
/// after it make no lookup per name, and what they see is right — a file renamed or
/// linked elsewhere (its inode lives apart from its name), a directory, and a file
/// open here with writes not yet committed (this mount's size).
#[test]
fn listings_carry_attributes_and_stats_after_them_ask_nothing() {
    let tmp = tempfile::tempdir().expect("tmp");
    let (data, mnt) = (tmp.path().join("data"), tmp.path().join("mnt"));
    let dev = start_dev(&data, &mnt);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let listen = format!("127.0.0.1:{port}");
    let m = SecondMount::with_args(&data, &tmp.path().join("mnt2"), &["--metrics-listen", &listen]);
    let metrics: std::net::SocketAddr = listen.parse().expect("addr");
    let dir = m.mount.join("listed");
    std::fs::create_dir(&dir).expect("mkdir");
    let mut want = std::collections::BTreeMap::new();
    for i in 0..60u32 {
        let name = format!("f{i:02}");
        std::fs::write(dir.join(&name), vec![7u8; 100 + i as usize]).expect("create");
        std::fs::set_permissions(dir.join(&name), std::fs::Permissions::from_mode(0o600 + i % 8)).expect("chmod");
        want.insert(name, (100 + u64::from(i), 0o600 + i % 8, 1u64));
    }
    for i in 0..5u32 {
        let (from, to) = (format!("f{i:02}"), format!("moved{i}"));
        std::fs::rename(dir.join(&from), dir.join(&to)).expect("rename");
        let v = want.remove(&from).expect("known");
        want.insert(to, v);
    }
    std::fs::hard_link(dir.join("f10"), dir.join("link10")).expect("link");
    want.get_mut("f10").expect("f10").2 = 2;
    want.insert("link10".into(), (110, 0o600 + 10 % 8, 2));
    std::fs::create_dir(dir.join("sub")).expect("mkdir sub");
    let mut open = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(dir.join("open"))
        .expect("create open");
    open.write_all(&[1u8; 5000]).expect("write, not committed");
    want.insert("open".into(), (5000, 0o644 & !0o022, 1));
    // Past the entry and attribute TTLs (1 s): the kernel keeps nothing it saw above.
    std::thread::sleep(Duration::from_millis(1500));

    let (lookups, plus) = (fs_ops(metrics, "lookup"), fs_ops(metrics, "readdirplus"));
    let mut seen = std::collections::BTreeMap::new();
    for e in std::fs::read_dir(&dir).expect("list") {
        let e = e.expect("entry");
        let md = std::fs::symlink_metadata(e.path()).expect("stat after the listing");
        let name = e.file_name().into_string().expect("utf-8");
        if name == "sub" {
            assert!(md.is_dir(), "sub is a directory");
            continue;
        }
        seen.insert(name, (md.len(), md.mode() & 0o7777, md.nlink()));
    }
    let asked = fs_ops(metrics, "lookup") - lookups;
    assert!(
        fs_ops(metrics, "readdirplus") > plus,
        "the listing was not a READDIRPLUS"
    );
    assert!(asked < 5.0, "{asked} lookups for {} names listed", want.len() + 1);
    // The kernel's mode may be masked by the umask for "open".
    let got_open = seen.get("open").copied();
    assert_eq!(
        got_open.map(|o| o.0),
        Some(5000),
        "this mount's size of a file it writes"
    );
    seen.remove("open");
    want.remove("open");
    assert_eq!(seen, want, "what stat says after the listing");
    drop(open);

    // rm -rf of the listed tree: one unlink per name, no lookup.
    let lookups = fs_ops(metrics, "lookup");
    let rm = Command::new("rm").arg("-rf").arg(&dir).status().expect("rm");
    assert!(rm.success());
    let asked = fs_ops(metrics, "lookup") - lookups;
    assert!(asked < 5.0, "rm -rf made {asked} lookups");
    assert!(!dir.exists());

    // A read-only handle asks for no flush at close (FOPEN_NOFLUSH); one open for
    // writing still does, and its close makes the data visible.
    // (A request is counted just after its answer: wait for the writer's count.)
    let file = m.mount.join("read-often");
    let before = fs_ops(metrics, "flush");
    std::fs::write(&file, b"shard").expect("write");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while fs_ops(metrics, "flush") <= before {
        assert!(std::time::Instant::now() < deadline, "a writer's close made no flush");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(200));
    let flushes = fs_ops(metrics, "flush");
    for _ in 0..20 {
        assert_eq!(std::fs::read(&file).expect("read"), b"shard");
    }
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(fs_ops(metrics, "flush"), flushes, "read-only closes flushed");
    assert_eq!(std::fs::read(dev.path("read-often")).expect("read elsewhere"), b"shard");
    drop(m);
}
