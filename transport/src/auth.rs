//! Connection handshake: mutual HMAC-SHA256 challenge-response over a key both sides
//! hold: the cluster secret (servers, admins), or a client key derived from it.
//!
//! ```text
//! server -> client  ServerHello  b"SHGH" | version u8 | 3 zero bytes | server_nonce[32]    (40 B)
//! client -> server  ClientProof  client_nonce[32] | identity[40]
//!                                | HMAC(key, "shingle-v1 client" | sn | cn | identity)     (104 B)
//! server -> client  ServerProof  verdict u8 (0 ok, 1 refused) | 3 zero bytes
//!                                | HMAC(key, "shingle-v1 server" | cn | sn | identity)     (36 B)
//! ```
//!
//! `identity` is all zeros for the cluster secret, else a client's serial (u64 LE) and
//! name (32 bytes, zero-padded); that client's key is HMAC(secret, "shingle-v1 client
//! key" | identity), which any server computes from the cluster secret, so servers
//! keep no key table and a client never holds the cluster secret. What the client may
//! do (its grant, or that it was revoked) is the cluster map's business: the server
//! only says who it is ([`Principal`]). Each side proves knowledge of the key over both
//! fresh nonces, so a recorded handshake cannot be replayed and a client never talks
//! to a server without the secret either. Nothing but these fixed-size messages is
//! read before the proof is checked, and the whole exchange runs under a timeout. No
//! key crosses the wire. See `docs/decisions/0003-authentication.md` and
//! `docs/decisions/0020-client-keys.md`.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

const HELLO_MAGIC: [u8; 4] = *b"SHGH";
/// The protocol version this build speaks: the server sends it in its hello and a
/// client of another version refuses the connection before anything else is said. It
/// covers the handshake, the frame layout and the body of every message kind of every
/// service, so it goes up whenever any of them changes shape; a mixed-version cluster
/// then refuses cleanly instead of misreading. 1: the first releases; 2: partition
/// copies move in pieces (`Install` gone, `Pull` position-only, `InstallPiece` and
/// `PullPiece` new); 3: stripe records apart from inode records (`Fetch` names
/// stripes, partition copies carry them, `PutStripes`/`CutStripes` mutations); 4: a
/// create can hand its creator stripe versions (`NsOp::Mknod` gained `reserve`); 5: a
/// primary fences the holders a map dropped before it acknowledges (`Fence`). See
/// docs/operations.md "Versions"; 6: client keys (the client's proof names who it is);
/// 7: a lock request may read the locked inodes once held (`Lock::fetch`, `Locked`); 8:
/// a commit of written stripes and a setattr in one operation (`NsOp::CommitWriteSetAttr`);
/// 9: a listing may carry its entries' attributes (`ReadOp::ReadDir::plus`, `DirEntry::attr`);
/// 10: a create that reserves versions answers the file's layout (`OpReply::Made`); 11:
/// an rmdir or a rename asks every node whether counts are still owed (`Quiet`).
pub const PROTOCOL_VERSION: u8 = 12;
/// Bytes of a handshake nonce.
pub const NONCE_LEN: usize = 32;
/// Bytes of a handshake MAC.
pub const MAC_LEN: usize = 32;
const HELLO_LEN: usize = 8 + NONCE_LEN;
const IDENTITY_LEN: usize = 8 + NAME_LEN;
/// Bytes of a client's proof: nonce, identity, MAC.
pub const PROOF_LEN: usize = NONCE_LEN + IDENTITY_LEN + MAC_LEN;
const VERDICT_LEN: usize = 4 + MAC_LEN;
const CLIENT_LABEL: &[u8] = b"shingle-v1 client";
const SERVER_LABEL: &[u8] = b"shingle-v1 server";
const KEY_LABEL: &[u8] = b"shingle-v1 client key";
const KEY_FILE_MAGIC: &str = "shingle-client-key";
/// Longest client name (bytes).
pub const NAME_LEN: usize = 32;
/// Shortest secret accepted.
pub const MIN_SECRET_LEN: usize = 16;

/// Who a client key belongs to: a name and the serial of its grant (a new grant of the
/// same name gets a new serial, so the keys of earlier ones stop working).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Identity {
    /// `[A-Za-z0-9._-]`, 1 to [`NAME_LEN`] bytes.
    pub name: String,
    /// At least 1.
    pub serial: u64,
}

impl Identity {
    /// Checks the name and the serial.
    pub fn new(name: &str, serial: u64) -> Result<Identity, AuthError> {
        let ok = !name.is_empty()
            && name.len() <= NAME_LEN
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if !ok {
            return Err(AuthError::BadName(name.chars().take(64).collect()));
        }
        if serial == 0 {
            return Err(AuthError::BadName(format!("{name} (serial 0)")));
        }
        Ok(Identity {
            name: name.to_string(),
            serial,
        })
    }

    fn encode(id: Option<&Identity>) -> [u8; IDENTITY_LEN] {
        let mut b = [0u8; IDENTITY_LEN];
        if let Some(id) = id {
            b[..8].copy_from_slice(&id.serial.to_le_bytes());
            b[8..8 + id.name.len()].copy_from_slice(id.name.as_bytes());
        }
        b
    }

    /// `None` for all zeros (the cluster secret); an error for anything malformed.
    fn decode(b: &[u8; IDENTITY_LEN]) -> Result<Option<Identity>, AuthError> {
        if b.iter().all(|&x| x == 0) {
            return Ok(None);
        }
        let serial = u64::from_le_bytes(b[..8].try_into().unwrap_or_default());
        let name = &b[8..];
        let len = name.iter().position(|&x| x == 0).unwrap_or(NAME_LEN);
        if name[len..].iter().any(|&x| x != 0) {
            return Err(AuthError::BadProof);
        }
        let name = std::str::from_utf8(&name[..len]).map_err(|_| AuthError::BadProof)?;
        Identity::new(name, serial).map(Some).map_err(|_| AuthError::BadProof)
    }
}

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}#{}", self.name, self.serial)
    }
}

/// Who is on the other end of an authenticated connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Principal {
    /// It holds the cluster secret: a node of the cluster, or an admin tool.
    Cluster,
    /// It holds the key of this client.
    Client(Identity),
}

/// The key a connection is made with: the shared cluster secret, or a client key
/// derived from it ([`ClusterSecret::client_key`]). Its bytes are never printed.
#[derive(Clone)]
pub struct ClusterSecret {
    bytes: Vec<u8>,
    identity: Option<Identity>,
}

impl std::fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.identity {
            None => f.write_str("ClusterSecret(..)"),
            Some(id) => write!(f, "ClientKey({id}, ..)"),
        }
    }
}

impl ClusterSecret {
    /// Wraps secret bytes; at least [`MIN_SECRET_LEN`] are required.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Self, AuthError> {
        let bytes = bytes.into();
        if bytes.len() < MIN_SECRET_LEN {
            return Err(AuthError::WeakSecret(bytes.len()));
        }
        Ok(ClusterSecret { bytes, identity: None })
    }

    /// Reads a secret file, or a client key file ([`ClusterSecret::key_file`]);
    /// surrounding whitespace is ignored.
    pub fn from_file(path: &std::path::Path) -> Result<Self, AuthError> {
        let raw = std::fs::read(path).map_err(|e| AuthError::SecretFile(path.display().to_string(), e.to_string()))?;
        let trimmed = raw.trim_ascii();
        if trimmed.starts_with(KEY_FILE_MAGIC.as_bytes()) {
            let text = std::str::from_utf8(trimmed).unwrap_or_default();
            return Self::parse_key_file(text)
                .ok_or_else(|| AuthError::SecretFile(path.display().to_string(), "malformed client key file".into()));
        }
        Self::new(trimmed.to_vec())
    }

    fn parse_key_file(text: &str) -> Option<Self> {
        let mut w = text.split_whitespace();
        let (magic, name, serial, hex) = (w.next()?, w.next()?, w.next()?, w.next()?);
        if magic != KEY_FILE_MAGIC || w.next().is_some() || hex.len() != 2 * MAC_LEN {
            return None;
        }
        let id = Identity::new(name, serial.parse().ok()?).ok()?;
        let bytes = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
            .collect::<Option<Vec<u8>>>()?;
        Some(ClusterSecret {
            bytes,
            identity: Some(id),
        })
    }

    /// Makes a new random secret (hex text, 64 characters) for `shingle format`.
    pub fn generate() -> Result<Self, AuthError> {
        let mut raw = [0u8; 32];
        getrandom::fill(&mut raw).map_err(|e| AuthError::Random(e.to_string()))?;
        let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        Self::new(hex.into_bytes())
    }

    /// The secret's bytes (for writing the secret file).
    pub fn expose(&self) -> &[u8] {
        &self.bytes
    }

    /// Whose key this is: `None` for the cluster secret.
    pub fn identity(&self) -> Option<&Identity> {
        self.identity.as_ref()
    }

    /// The key of client `id`, derived from this cluster secret (`None` when this is
    /// a client key already: only the cluster secret makes keys).
    pub fn client_key(&self, id: &Identity) -> Option<ClusterSecret> {
        if self.identity.is_some() {
            return None;
        }
        let mut m = self.hmac();
        m.update(KEY_LABEL);
        m.update(&Identity::encode(Some(id)));
        Some(ClusterSecret {
            bytes: m.finalize().into_bytes().to_vec(),
            identity: Some(id.clone()),
        })
    }

    /// The text of a client key file (`None` for the cluster secret): one line,
    /// `shingle-client-key NAME SERIAL HEX`.
    pub fn key_file(&self) -> Option<String> {
        let id = self.identity.as_ref()?;
        let hex: String = self.bytes.iter().map(|b| format!("{b:02x}")).collect();
        Some(format!("{KEY_FILE_MAGIC} {} {} {hex}\n", id.name, id.serial))
    }

    /// The proof a client with this key sends for `server_nonce` and its own
    /// `client_nonce` (what [`check_proof`] checks).
    pub fn client_proof(&self, server_nonce: &[u8; NONCE_LEN], client_nonce: &[u8; NONCE_LEN]) -> Vec<u8> {
        let id_bytes = Identity::encode(self.identity.as_ref());
        let mut proof = Vec::with_capacity(PROOF_LEN);
        proof.extend_from_slice(client_nonce);
        proof.extend_from_slice(&id_bytes);
        proof.extend_from_slice(
            &self
                .mac(CLIENT_LABEL, server_nonce, client_nonce, &id_bytes)
                .finalize()
                .into_bytes(),
        );
        proof
    }

    fn hmac(&self) -> Hmac<Sha256> {
        // HMAC accepts keys of any length; new_from_slice cannot fail for it.
        <Hmac<Sha256> as KeyInit>::new_from_slice(&self.bytes).unwrap_or_else(|_| unreachable!())
    }

    fn mac(&self, label: &[u8], first: &[u8; NONCE_LEN], second: &[u8; NONCE_LEN], id: &[u8]) -> Hmac<Sha256> {
        let mut m = self.hmac();
        m.update(label);
        m.update(first);
        m.update(second);
        m.update(id);
        m
    }
}

/// Why a handshake failed.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// The secret is too short to be a secret.
    #[error("cluster secret has {0} bytes; at least 16 are required")]
    WeakSecret(usize),
    /// The secret file could not be read.
    #[error("cannot read cluster secret file {0}: {1}")]
    SecretFile(String, String),
    /// The OS random source failed.
    #[error("cannot draw random bytes: {0}")]
    Random(String),
    /// The peer's proof does not match our secret.
    #[error("peer failed authentication (wrong cluster secret or client key)")]
    BadProof,
    /// The server refused our proof.
    #[error("server refused authentication (wrong cluster secret or client key)")]
    Refused,
    /// A client name that is not `[A-Za-z0-9._-]{1,32}`, or serial 0.
    #[error("bad client name {0:?}: 1 to 32 of A-Z a-z 0-9 . _ - and a serial of 1 or more")]
    BadName(String),
    /// A client key was given where only the cluster secret will do (serving).
    #[error("a client key cannot serve: servers hold the cluster secret")]
    ClientKey,
    /// The peer does not speak the Shingle handshake.
    #[error("peer is not a Shingle endpoint (bad hello)")]
    NotShingle,
    /// The peer speaks a protocol version we do not.
    #[error(
        "peer speaks protocol version {0}, this build speaks {PROTOCOL_VERSION}: run one release across the cluster"
    )]
    Version(u8),
    /// The handshake did not finish in time.
    #[error("handshake timed out after {0:?}")]
    Timeout(Duration),
    /// The connection failed during the handshake.
    #[error("connection failed during handshake: {0}")]
    Io(#[from] std::io::Error),
}

fn nonce() -> Result<[u8; NONCE_LEN], AuthError> {
    let mut n = [0u8; NONCE_LEN];
    getrandom::fill(&mut n).map_err(|e| AuthError::Random(e.to_string()))?;
    Ok(n)
}

/// Server side: challenge the client and check its proof. Returns, only when the peer
/// proved a key made from `secret`, who it is; on a bad proof the client is told and
/// the error returned.
pub async fn accept<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    secret: &ClusterSecret,
    timeout: Duration,
) -> Result<Principal, AuthError> {
    if secret.identity.is_some() {
        return Err(AuthError::ClientKey);
    }
    tokio::time::timeout(timeout, accept_inner(stream, secret))
        .await
        .map_err(|_| AuthError::Timeout(timeout))?
}

async fn accept_inner<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    secret: &ClusterSecret,
) -> Result<Principal, AuthError> {
    let server_nonce = nonce()?;
    let mut hello = [0u8; HELLO_LEN];
    hello[..4].copy_from_slice(&HELLO_MAGIC);
    hello[4] = PROTOCOL_VERSION;
    hello[8..].copy_from_slice(&server_nonce);
    stream.write_all(&hello).await?;
    stream.flush().await?;

    let mut proof = [0u8; PROOF_LEN];
    stream.read_exact(&mut proof).await?;
    let checked = check_proof(secret, &server_nonce, &proof);
    let mut verdict = [0u8; VERDICT_LEN];
    match &checked {
        Ok((_, mac)) => verdict[4..].copy_from_slice(mac),
        Err(_) => verdict[0] = 1,
    }
    stream.write_all(&verdict).await?;
    stream.flush().await?;
    checked.map(|(who, _)| who)
}

/// The server's check of a client's proof (any bytes; only a whole proof can pass):
/// who proved which key, and the server's own proof to send back. Pure, so that it
/// is fuzzed without sockets (`transport/fuzz`, target `handshake`).
pub fn check_proof(
    secret: &ClusterSecret,
    server_nonce: &[u8; NONCE_LEN],
    proof: &[u8],
) -> Result<(Principal, [u8; MAC_LEN]), AuthError> {
    if proof.len() != PROOF_LEN || secret.identity.is_some() {
        return Err(AuthError::BadProof);
    }
    let mut client_nonce = [0u8; NONCE_LEN];
    client_nonce.copy_from_slice(&proof[..NONCE_LEN]);
    let mut id_bytes = [0u8; IDENTITY_LEN];
    id_bytes.copy_from_slice(&proof[NONCE_LEN..NONCE_LEN + IDENTITY_LEN]);
    // The key the client must have proved: the secret, or its client key.
    let (key, who) = match Identity::decode(&id_bytes)? {
        None => (secret.clone(), Principal::Cluster),
        Some(id) => (
            secret.client_key(&id).ok_or(AuthError::BadProof)?,
            Principal::Client(id),
        ),
    };
    key.mac(CLIENT_LABEL, server_nonce, &client_nonce, &id_bytes)
        .verify_slice(&proof[NONCE_LEN + IDENTITY_LEN..])
        .map_err(|_| AuthError::BadProof)?;
    let mut mac = [0u8; MAC_LEN];
    mac.copy_from_slice(
        &key.mac(SERVER_LABEL, &client_nonce, server_nonce, &id_bytes)
            .finalize()
            .into_bytes(),
    );
    Ok((who, mac))
}

/// Client side: answer the server's challenge and check the server's proof.
pub async fn connect<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    secret: &ClusterSecret,
    timeout: Duration,
) -> Result<(), AuthError> {
    tokio::time::timeout(timeout, connect_inner(stream, secret))
        .await
        .map_err(|_| AuthError::Timeout(timeout))?
}

async fn connect_inner<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    secret: &ClusterSecret,
) -> Result<(), AuthError> {
    let mut hello = [0u8; HELLO_LEN];
    stream.read_exact(&mut hello).await?;
    if hello[..4] != HELLO_MAGIC || hello[5..8] != [0, 0, 0] {
        return Err(AuthError::NotShingle);
    }
    if hello[4] != PROTOCOL_VERSION {
        return Err(AuthError::Version(hello[4]));
    }
    let mut server_nonce = [0u8; NONCE_LEN];
    server_nonce.copy_from_slice(&hello[8..]);
    let client_nonce = nonce()?;
    let id_bytes = Identity::encode(secret.identity.as_ref());
    let proof = secret.client_proof(&server_nonce, &client_nonce);
    stream.write_all(&proof).await?;
    stream.flush().await?;

    let mut verdict = [0u8; VERDICT_LEN];
    stream.read_exact(&mut verdict).await?;
    if verdict[0] != 0 {
        return Err(AuthError::Refused);
    }
    secret
        .mac(SERVER_LABEL, &client_nonce, &server_nonce, &id_bytes)
        .verify_slice(&verdict[4..])
        .map_err(|_| AuthError::BadProof)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(s: &str) -> ClusterSecret {
        ClusterSecret::new(s.as_bytes().to_vec()).expect("secret")
    }

    #[tokio::test]
    async fn same_secret_authenticates_both_ways() {
        let (mut a, mut b) = tokio::io::duplex(1024);
        let s = secret("0123456789abcdef-same");
        let t = Duration::from_secs(5);
        let (x, y) = tokio::join!(accept(&mut a, &s, t), connect(&mut b, &s, t));
        assert_eq!(x.expect("server side"), Principal::Cluster);
        y.expect("client side");
    }

    /// A client key made from the secret authenticates as that client; a key of
    /// another serial, of another name, or made from another secret does not; a
    /// client key cannot serve.
    #[tokio::test]
    async fn client_keys_name_their_client_and_only_their_client() {
        let s = secret("0123456789abcdef-same");
        let t = Duration::from_secs(5);
        let id = Identity::new("gpu-host-1", 3).expect("id");
        let key = s.client_key(&id).expect("key");
        assert_eq!(format!("{key:?}"), "ClientKey(gpu-host-1#3, ..)");
        let (mut a, mut b) = tokio::io::duplex(1024);
        let (x, y) = tokio::join!(accept(&mut a, &s, t), connect(&mut b, &key, t));
        assert_eq!(x.expect("server side"), Principal::Client(id.clone()));
        y.expect("client side");
        // The same key bytes claiming another serial or name, and a key of another cluster.
        let forged = |name: &str, serial| ClusterSecret {
            bytes: key.bytes.clone(),
            identity: Some(Identity::new(name, serial).expect("id")),
        };
        let other = secret("0123456789abcdef-other").client_key(&id).expect("key");
        for k in [forged("gpu-host-1", 4), forged("gpu-host-2", 3), other] {
            let (mut a, mut b) = tokio::io::duplex(1024);
            let (x, y) = tokio::join!(accept(&mut a, &s, t), connect(&mut b, &k, t));
            assert!(matches!(x, Err(AuthError::BadProof)), "{k:?}");
            assert!(matches!(y, Err(AuthError::Refused)), "{k:?}");
        }
        let (mut a, _b) = tokio::io::duplex(1024);
        assert!(matches!(accept(&mut a, &key, t).await, Err(AuthError::ClientKey)));
        assert!(key.client_key(&id).is_none(), "only the cluster secret makes keys");
    }

    #[test]
    fn key_files_round_trip_and_names_are_checked() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = secret("0123456789abcdef-same");
        let key = s
            .client_key(&Identity::new("k8s.node_7", 12).expect("id"))
            .expect("key");
        let text = key.key_file().expect("a client key");
        assert!(text.starts_with("shingle-client-key k8s.node_7 12 "), "{text}");
        let path = dir.path().join("key");
        std::fs::write(&path, &text).expect("write");
        let back = ClusterSecret::from_file(&path).expect("read");
        assert_eq!((back.expose(), back.identity()), (key.expose(), key.identity()));
        assert!(s.key_file().is_none());
        for bad in [
            "shingle-client-key x 1 zz",
            "shingle-client-key x 0 00",
            "shingle-client-key a/b 1 00",
        ] {
            std::fs::write(&path, bad).expect("write");
            assert!(ClusterSecret::from_file(&path).is_err(), "{bad}");
        }
        for name in ["", "a b", "ü", &"x".repeat(33)] {
            assert!(Identity::new(name, 1).is_err(), "{name:?}");
        }
        assert!(Identity::new(&"x".repeat(32), 1).is_ok());
    }

    /// A server of another protocol version is refused by the client at its hello,
    /// with both versions named, before the client sends anything.
    #[tokio::test]
    async fn another_protocol_version_is_refused() {
        let (mut a, mut b) = tokio::io::duplex(1024);
        let s = secret("0123456789abcdef-same");
        let t = Duration::from_secs(5);
        let mut hello = [0u8; HELLO_LEN];
        hello[..4].copy_from_slice(&HELLO_MAGIC);
        hello[4] = PROTOCOL_VERSION + 1;
        a.write_all(&hello).await.expect("hello");
        let e = connect(&mut b, &s, t).await.expect_err("refused");
        assert!(matches!(e, AuthError::Version(v) if v == PROTOCOL_VERSION + 1), "{e}");
        assert!(
            e.to_string().contains(&format!("this build speaks {PROTOCOL_VERSION}")),
            "{e}"
        );
        drop(b);
        let mut rest = Vec::new();
        a.read_to_end(&mut rest).await.expect("read");
        assert!(rest.is_empty(), "the client said nothing after the hello");
    }

    #[tokio::test]
    async fn wrong_secret_is_refused_on_both_sides() {
        let (mut a, mut b) = tokio::io::duplex(1024);
        let t = Duration::from_secs(5);
        let (ss, cs) = (secret("0123456789abcdef-server"), secret("0123456789abcdef-client"));
        let (x, y) = tokio::join!(accept(&mut a, &ss, t), connect(&mut b, &cs, t));
        assert!(matches!(x, Err(AuthError::BadProof)));
        assert!(matches!(y, Err(AuthError::Refused)));
    }

    #[tokio::test]
    async fn rogue_server_is_detected_by_client() {
        // A "server" that answers verdict 0 without knowing the secret.
        let (mut a, mut b) = tokio::io::duplex(1024);
        let fake = async move {
            let mut hello = [0u8; HELLO_LEN];
            hello[..4].copy_from_slice(&HELLO_MAGIC);
            hello[4] = PROTOCOL_VERSION;
            a.write_all(&hello).await.expect("write");
            let mut p = [0u8; PROOF_LEN];
            a.read_exact(&mut p).await.expect("read");
            assert!(
                p[NONCE_LEN..NONCE_LEN + IDENTITY_LEN].iter().all(|&b| b == 0),
                "no identity"
            );
            a.write_all(&[0u8; VERDICT_LEN]).await.expect("write");
        };
        let s = secret("0123456789abcdef");
        let (_, r) = tokio::join!(fake, connect(&mut b, &s, Duration::from_secs(5)));
        assert!(matches!(r, Err(AuthError::BadProof)));
    }

    #[tokio::test]
    async fn silent_peer_times_out() {
        let (mut a, _b) = tokio::io::duplex(1024);
        let r = accept(&mut a, &secret("0123456789abcdef"), Duration::from_millis(50)).await;
        assert!(matches!(r, Err(AuthError::Timeout(_))));
    }

    #[test]
    fn weak_secret_rejected_and_debug_hides_it() {
        assert!(matches!(
            ClusterSecret::new(b"short".to_vec()),
            Err(AuthError::WeakSecret(5))
        ));
        let s = ClusterSecret::generate().expect("generate");
        assert_eq!(s.expose().len(), 64);
        assert_eq!(format!("{s:?}"), "ClusterSecret(..)");
    }
}
