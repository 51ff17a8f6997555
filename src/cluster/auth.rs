//! Cluster authentication with a shared secret.
//!
//! chitchat does not authenticate gossip, so [`AuthTransport`] replaces its
//! UDP transport: every datagram carries an HMAC-SHA256 over its bytes, and a
//! datagram without a valid one is dropped before chitchat sees it — an
//! unauthenticated sender can never become a member, so it never enters the
//! ring. Peer RPCs carry a [`PeerToken`]: the sender's node id and a
//! timestamp, MACed, refused outside a short window.
//!
//! What this does not do: encrypt. Gossip and peer traffic are readable on
//! the wire (node ids, addresses, keys being forwarded); use a private
//! network or mTLS (the security issue) where that matters. Without a secret
//! the node accepts any peer and logs a warning at start.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use chitchat::transport::{Socket, Transport};
use chitchat::{ChitchatMessage, Deserializable, Serializable};
use hmac::{KeyInit, Mac};
use sha2::Sha256;

use super::faults::Faults;

type HmacSha256 = hmac::Hmac<Sha256>;

/// Bytes of MAC appended to each datagram.
pub const MAC_LEN: usize = 32;
/// The largest UDP payload.
const MAX_DATAGRAM: usize = 65_507;
/// How far a peer token's timestamp may be from this node's clock.
pub const TOKEN_WINDOW: Duration = Duration::from_secs(30);
/// The gRPC metadata key carrying the peer token.
pub const TOKEN_HEADER: &str = "x-sluice-peer";

/// The cluster secret, if one is configured.
#[derive(Clone)]
pub struct Secret(Option<Vec<u8>>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Secret(set)"
        } else {
            "Secret(none)"
        })
    }
}

impl Secret {
    pub fn new(secret: Option<&[u8]>) -> Secret {
        Secret(secret.filter(|s| !s.is_empty()).map(<[u8]>::to_vec))
    }

    pub fn is_set(&self) -> bool {
        self.0.is_some()
    }

    fn mac(&self, parts: &[&[u8]]) -> Option<[u8; MAC_LEN]> {
        let key = self.0.as_ref()?;
        let mut mac = HmacSha256::new_from_slice(key).ok()?;
        for p in parts {
            mac.update(p);
        }
        Some(mac.finalize().into_bytes().into())
    }

    fn verify(&self, parts: &[&[u8]], tag: &[u8]) -> bool {
        let Some(key) = &self.0 else { return true };
        let Ok(mut mac) = HmacSha256::new_from_slice(key) else {
            return false;
        };
        for p in parts {
            mac.update(p);
        }
        mac.verify_slice(tag).is_ok() // constant time
    }

    /// Append the datagram MAC (nothing without a secret).
    pub fn seal(&self, datagram: &mut Vec<u8>) {
        if let Some(tag) = self.mac(&[b"sluice-gossip-v1", datagram]) {
            datagram.extend_from_slice(&tag);
        }
    }

    /// The datagram's payload if its MAC is valid (or no secret is set).
    pub fn open<'a>(&self, datagram: &'a [u8]) -> Option<&'a [u8]> {
        if !self.is_set() {
            return Some(datagram);
        }
        let split = datagram.len().checked_sub(MAC_LEN)?;
        let (body, tag) = datagram.split_at(split);
        self.verify(&[b"sluice-gossip-v1", body], tag)
            .then_some(body)
    }

    /// A token for a peer call from `node_id`, at the current time.
    pub fn peer_token(&self, node_id: &str) -> Option<String> {
        let ms = unix_ms();
        let tag = self.mac(&[b"sluice-peer-v1", node_id.as_bytes(), &ms.to_le_bytes()])?;
        Some(format!("{node_id}:{ms}:{}", hex(&tag)))
    }

    /// Check a peer token; returns the sender's node id.
    pub fn check_peer_token(&self, token: Option<&str>) -> Result<Option<String>, &'static str> {
        if !self.is_set() {
            return Ok(None);
        }
        let token = token.ok_or("missing peer token")?;
        let mut parts = token.rsplitn(3, ':');
        let (tag, ms, node) = match (parts.next(), parts.next(), parts.next()) {
            (Some(t), Some(m), Some(n)) => (t, m, n),
            _ => return Err("malformed peer token"),
        };
        let ms: u64 = ms.parse().map_err(|_| "malformed peer token")?;
        let tag = unhex(tag).ok_or("malformed peer token")?;
        if !self.verify(
            &[b"sluice-peer-v1", node.as_bytes(), &ms.to_le_bytes()],
            &tag,
        ) {
            return Err("invalid peer token");
        }
        if unix_ms().abs_diff(ms) > TOKEN_WINDOW.as_millis() as u64 {
            return Err("expired peer token");
        }
        Ok(Some(node.to_string()))
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// chitchat's UDP transport with MACed datagrams, over a socket bound in
/// advance (so a node started on port 0 knows its gossip port before it
/// builds its chitchat id).
pub struct AuthTransport {
    socket: Mutex<Option<std::net::UdpSocket>>,
    secret: Secret,
    faults: Arc<Faults>,
}

impl AuthTransport {
    /// `socket` must be non-blocking.
    pub fn new(socket: std::net::UdpSocket, secret: Secret, faults: Arc<Faults>) -> AuthTransport {
        AuthTransport {
            socket: Mutex::new(Some(socket)),
            secret,
            faults,
        }
    }
}

#[async_trait]
impl Transport for AuthTransport {
    async fn open(&self, _listen_addr: SocketAddr) -> anyhow::Result<Box<dyn Socket>> {
        let socket = self
            .socket
            .lock()
            .map_err(|_| anyhow::anyhow!("gossip socket lock poisoned"))?
            .take()
            .ok_or_else(|| anyhow::anyhow!("the gossip socket was already opened"))?;
        Ok(Box::new(AuthSocket {
            socket: tokio::net::UdpSocket::from_std(socket)?,
            secret: self.secret.clone(),
            faults: self.faults.clone(),
            buf: vec![0; MAX_DATAGRAM],
        }))
    }
}

struct AuthSocket {
    socket: tokio::net::UdpSocket,
    secret: Secret,
    faults: Arc<Faults>,
    buf: Vec<u8>,
}

#[async_trait]
impl Socket for AuthSocket {
    async fn send(&mut self, to: SocketAddr, message: ChitchatMessage) -> anyhow::Result<()> {
        if self.faults.gossip_cut(&to) {
            return Ok(());
        }
        let mut datagram = message.serialize_to_vec();
        self.secret.seal(&mut datagram);
        if datagram.len() > MAX_DATAGRAM {
            // chitchat sizes deltas for a bare datagram; the MAC can tip a
            // full one over. Drop it: the next round sends a fresh delta.
            tracing::warn!(
                len = datagram.len(),
                "gossip datagram too large with its MAC; dropped"
            );
            return Ok(());
        }
        if let Err(e) = self.socket.send_to(&datagram, to).await {
            // A peer that is down is gossip's normal case, not a broken transport.
            tracing::debug!(%to, error = %e, "gossip send failed");
        }
        Ok(())
    }

    async fn recv(&mut self) -> anyhow::Result<(SocketAddr, ChitchatMessage)> {
        loop {
            let (n, from) = match self.socket.recv_from(&mut self.buf).await {
                Ok(r) => r,
                Err(e) => {
                    tracing::debug!(error = %e, "gossip recv failed");
                    continue;
                }
            };
            if self.faults.gossip_cut(&from) {
                continue;
            }
            let Some(mut body) = self.secret.open(&self.buf[..n]) else {
                tracing::warn!(%from, "gossip datagram without a valid MAC; dropped");
                continue;
            };
            match ChitchatMessage::deserialize(&mut body) {
                Ok(message) => return Ok((from, message)),
                Err(e) => tracing::warn!(%from, error = %e, "invalid gossip datagram; dropped"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datagrams_need_the_same_secret() {
        let a = Secret::new(Some(b"one"));
        let b = Secret::new(Some(b"two"));
        let mut d = b"hello".to_vec();
        a.seal(&mut d);
        assert_eq!(d.len(), 5 + MAC_LEN);
        assert_eq!(a.open(&d), Some(&b"hello"[..]));
        assert_eq!(b.open(&d), None);
        assert_eq!(a.open(b"short"), None);
        let mut tampered = d.clone();
        tampered[0] ^= 1;
        assert_eq!(a.open(&tampered), None);
        let none = Secret::new(None);
        assert_eq!(none.open(b"plain"), Some(&b"plain"[..]));
    }

    #[test]
    fn peer_tokens_name_the_sender_and_need_the_secret() {
        let s = Secret::new(Some(b"k"));
        let t = s.peer_token("node:a").unwrap();
        assert_eq!(s.check_peer_token(Some(&t)), Ok(Some("node:a".into())));
        assert!(
            Secret::new(Some(b"other"))
                .check_peer_token(Some(&t))
                .is_err()
        );
        assert!(s.check_peer_token(None).is_err());
        assert!(s.check_peer_token(Some("a:1:zz")).is_err());
        let stale = format!(
            "n:{}:{}",
            1,
            hex(&s
                .mac(&[b"sluice-peer-v1", b"n", &1u64.to_le_bytes()])
                .unwrap())
        );
        assert_eq!(s.check_peer_token(Some(&stale)), Err("expired peer token"));
        assert_eq!(Secret::new(None).check_peer_token(None), Ok(None));
    }
}
