//! Connection handshake: mutual HMAC-SHA256 challenge-response over the cluster secret.
//!
//! ```text
//! server -> client  ServerHello  b"SHGH" | version u8 | 3 zero bytes | server_nonce[32]    (40 B)
//! client -> server  ClientProof  client_nonce[32] | HMAC(secret, "shingle-v1 client" | sn | cn)  (64 B)
//! server -> client  ServerProof  verdict u8 (0 ok, 1 refused) | 3 zero bytes
//!                                | HMAC(secret, "shingle-v1 server" | cn | sn)  (36 B)
//! ```
//!
//! Each side proves knowledge of the secret over both fresh nonces, so a recorded
//! handshake cannot be replayed and a client never talks to a server without the
//! secret either. Nothing but these fixed-size messages is read before the proof is
//! checked, and the whole exchange runs under a timeout. The secret never crosses
//! the wire. See `docs/decisions/0003-authentication.md` for what this does not protect.

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
/// docs/operations.md "Versions".
pub const PROTOCOL_VERSION: u8 = 5;
const NONCE_LEN: usize = 32;
const MAC_LEN: usize = 32;
const HELLO_LEN: usize = 8 + NONCE_LEN;
const PROOF_LEN: usize = NONCE_LEN + MAC_LEN;
const VERDICT_LEN: usize = 4 + MAC_LEN;
const CLIENT_LABEL: &[u8] = b"shingle-v1 client";
const SERVER_LABEL: &[u8] = b"shingle-v1 server";
/// Shortest secret accepted.
pub const MIN_SECRET_LEN: usize = 16;

/// The shared cluster secret. Its bytes are never printed.
#[derive(Clone)]
pub struct ClusterSecret(Vec<u8>);

impl std::fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterSecret(..)")
    }
}

impl ClusterSecret {
    /// Wraps secret bytes; at least [`MIN_SECRET_LEN`] are required.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Self, AuthError> {
        let bytes = bytes.into();
        if bytes.len() < MIN_SECRET_LEN {
            return Err(AuthError::WeakSecret(bytes.len()));
        }
        Ok(ClusterSecret(bytes))
    }

    /// Reads a secret file; surrounding whitespace is ignored.
    pub fn from_file(path: &std::path::Path) -> Result<Self, AuthError> {
        let raw = std::fs::read(path).map_err(|e| AuthError::SecretFile(path.display().to_string(), e.to_string()))?;
        let trimmed = raw.trim_ascii();
        Self::new(trimmed.to_vec())
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
        &self.0
    }

    fn mac(&self, label: &[u8], first: &[u8; NONCE_LEN], second: &[u8; NONCE_LEN]) -> Hmac<Sha256> {
        // HMAC accepts keys of any length; new_from_slice cannot fail for it.
        let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.0).unwrap_or_else(|_| unreachable!());
        m.update(label);
        m.update(first);
        m.update(second);
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
    #[error("peer failed authentication (wrong cluster secret)")]
    BadProof,
    /// The server refused our proof.
    #[error("server refused authentication (wrong cluster secret)")]
    Refused,
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

/// Server side: challenge the client and check its proof. Returns only when the peer
/// proved the secret; on a bad proof the client is told and the error returned.
pub async fn accept<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    secret: &ClusterSecret,
    timeout: Duration,
) -> Result<(), AuthError> {
    tokio::time::timeout(timeout, accept_inner(stream, secret))
        .await
        .map_err(|_| AuthError::Timeout(timeout))?
}

async fn accept_inner<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    secret: &ClusterSecret,
) -> Result<(), AuthError> {
    let server_nonce = nonce()?;
    let mut hello = [0u8; HELLO_LEN];
    hello[..4].copy_from_slice(&HELLO_MAGIC);
    hello[4] = PROTOCOL_VERSION;
    hello[8..].copy_from_slice(&server_nonce);
    stream.write_all(&hello).await?;
    stream.flush().await?;

    let mut proof = [0u8; PROOF_LEN];
    stream.read_exact(&mut proof).await?;
    let mut client_nonce = [0u8; NONCE_LEN];
    client_nonce.copy_from_slice(&proof[..NONCE_LEN]);
    let ok = secret
        .mac(CLIENT_LABEL, &server_nonce, &client_nonce)
        .verify_slice(&proof[NONCE_LEN..])
        .is_ok();
    let mut verdict = [0u8; VERDICT_LEN];
    if ok {
        let mac = secret
            .mac(SERVER_LABEL, &client_nonce, &server_nonce)
            .finalize()
            .into_bytes();
        verdict[4..].copy_from_slice(&mac);
    } else {
        verdict[0] = 1;
    }
    stream.write_all(&verdict).await?;
    stream.flush().await?;
    if ok { Ok(()) } else { Err(AuthError::BadProof) }
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
    let mut proof = [0u8; PROOF_LEN];
    proof[..NONCE_LEN].copy_from_slice(&client_nonce);
    proof[NONCE_LEN..].copy_from_slice(
        &secret
            .mac(CLIENT_LABEL, &server_nonce, &client_nonce)
            .finalize()
            .into_bytes(),
    );
    stream.write_all(&proof).await?;
    stream.flush().await?;

    let mut verdict = [0u8; VERDICT_LEN];
    stream.read_exact(&mut verdict).await?;
    if verdict[0] != 0 {
        return Err(AuthError::Refused);
    }
    secret
        .mac(SERVER_LABEL, &client_nonce, &server_nonce)
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
        x.expect("server side");
        y.expect("client side");
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
