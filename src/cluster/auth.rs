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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chitchat::transport::{Socket, Transport};
use chitchat::{ChitchatMessage, Deserializable, Serializable};
use hmac::{KeyInit, Mac};
use sha2::Sha256;

use super::faults::Faults;
use super::replay::Replays;
use crate::clock::{SharedClock, SystemClock};
use crate::net::{DatagramSocket, Datagrams};

type HmacSha256 = hmac::Hmac<Sha256>;

/// Bytes of MAC appended to each datagram.
pub const MAC_LEN: usize = 32;
/// The largest UDP payload.
const MAX_DATAGRAM: usize = 65_507;
// chitchat (patched, `vendor/chitchat/PATCHES.md`) builds every message to
// leave `TRANSPORT_RESERVE` bytes free: a sealed message fits a datagram by
// construction.
const _: () = assert!(MAC_LEN <= chitchat::TRANSPORT_RESERVE);
const _: () = assert!(chitchat::MAX_MESSAGE_SIZE + MAC_LEN <= MAX_DATAGRAM);
/// How far a peer token's timestamp may be from this node's clock, unless
/// configured (`cluster.token_window`).
pub use crate::config::TOKEN_WINDOW;
/// Distinct token senders remembered for replay checks (nodes, and operator
/// CLI runs).
const MAX_SENDERS: usize = 10_000;
/// The gRPC metadata key carrying the peer token.
pub const TOKEN_HEADER: &str = "x-sluice-peer";
/// The caller's membership on every peer call: its generation (8 bytes,
/// big-endian) then its node id.
pub const MEMBER_HEADER: &str = "x-sluice-member-bin";
/// On a refused peer call: the caller's generation is among the answering
/// node's tombstones (the generation, in decimal). The caller rejoins.
pub const BURIED_HEADER: &str = "x-sluice-buried";
/// On a peer call refused as [`EXPIRED`]: the answering node's clock,
/// MACed over the refused token (see [`Secret::clock_word`]).
pub const CLOCK_HEADER: &str = "x-sluice-clock";
/// Why a token stamped outside the window is refused.
pub const EXPIRED: &str = "expired peer token";

/// The cluster secret, if one is configured, with this node's token state:
/// its run id and sequence for the tokens it mints, and the replay window
/// for the tokens it checks. Cheap to clone (one `Arc`).
#[derive(Clone)]
pub struct Secret(Arc<Shared>);

struct Shared {
    key: Option<Vec<u8>>,
    /// This process's run: tokens carry it so a receiver keeps one replay
    /// window per run of each sender.
    run: u64,
    seq: AtomicU64,
    window: Duration,
    /// A std mutex: held for a map lookup and a few word operations, never
    /// across an await.
    replays: Mutex<Replays>,
    /// Whose wall clock stamps and checks tokens (and names the run).
    clock: SharedClock,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.is_set() {
            "Secret(set)"
        } else {
            "Secret(none)"
        })
    }
}

impl Secret {
    pub fn new(secret: Option<&[u8]>) -> Secret {
        Secret::with_window(secret, TOKEN_WINDOW)
    }

    /// A secret whose peer tokens are valid `window` either side of now.
    pub fn with_window(secret: Option<&[u8]>, window: Duration) -> Secret {
        Secret::with_clock(secret, window, Arc::new(SystemClock::new()))
    }

    /// [`Secret::with_window`], on `clock`'s wall clock (a node's own).
    pub fn with_clock(secret: Option<&[u8]>, window: Duration, clock: SharedClock) -> Secret {
        Secret(Arc::new(Shared {
            key: secret.filter(|s| !s.is_empty()).map(<[u8]>::to_vec),
            run: clock.wall(),
            seq: AtomicU64::new(0),
            window,
            replays: Mutex::new(Replays::new(MAX_SENDERS, window.as_millis() as u64)),
            clock,
        }))
    }

    fn unix_ms(&self) -> u64 {
        self.0.clock.wall() / 1_000_000
    }

    pub fn is_set(&self) -> bool {
        self.0.key.is_some()
    }

    fn mac(&self, parts: &[&[u8]]) -> Option<[u8; MAC_LEN]> {
        let key = self.0.key.as_ref()?;
        let mut mac = HmacSha256::new_from_slice(key).ok()?;
        for p in parts {
            mac.update(p);
        }
        Some(mac.finalize().into_bytes().into())
    }

    fn verify(&self, parts: &[&[u8]], tag: &[u8]) -> bool {
        let Some(key) = &self.0.key else { return true };
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

    /// A fresh token for one call from `sender`, at the current time:
    /// `sender:run:seq:ms:mac`, good at any node (the operator's CLI, which
    /// knows an address, not a node id; peers of protocol 2). Each token is
    /// accepted once.
    pub fn peer_token(&self, sender: &str) -> Option<String> {
        self.peer_token_for(sender, None, 0).map(|(token, _)| token)
    }

    /// A fresh token for one call from `sender` to `receiver` (when given:
    /// good there only), stamped `offset_ms` off this node's clock — on
    /// the receiver's clock, as its [`Secret::clock_word`] taught — with
    /// its sequence number (what a clock word answers).
    pub fn peer_token_for(
        &self,
        sender: &str,
        receiver: Option<&str>,
        offset_ms: i64,
    ) -> Option<(String, u64)> {
        let seq = self.0.seq.fetch_add(1, Ordering::Relaxed);
        let ms = self.unix_ms().saturating_add_signed(offset_ms);
        let tag = self.mac(&[&token_message(sender, receiver, self.0.run, seq, ms)])?;
        let run = self.0.run;
        Some((format!("{sender}:{run}:{seq}:{ms}:{}", hex(&tag)), seq))
    }

    /// A token's parts, its MAC checked — bound to `me`, or to no receiver
    /// — not its time, nor replays.
    fn authentic<'a>(&self, token: &'a str, me: &str) -> Result<Token<'a>, &'static str> {
        let malformed = "malformed peer token";
        let mut parts = token.rsplitn(5, ':');
        let (tag, ms, seq, run, sender) = match (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) {
            (Some(t), Some(m), Some(q), Some(r), Some(s)) => (t, m, q, r, s),
            _ => return Err(malformed),
        };
        let number = |s: &str| s.parse::<u64>().map_err(|_| malformed);
        let (ms, seq, run) = (number(ms)?, number(seq)?, number(run)?);
        let tag = unhex(tag).ok_or(malformed)?;
        let bound = |receiver| self.verify(&[&token_message(sender, receiver, run, seq, ms)], &tag);
        if !bound(Some(me)) && !bound(None) {
            return Err("invalid peer token");
        }
        Ok(Token {
            sender,
            run,
            seq,
            ms,
        })
    }

    /// Check a peer token at node `me`: valid MAC (for `me`, or for any
    /// node), inside the window, never seen before. Returns the sender's
    /// id.
    pub fn check_peer_token(
        &self,
        token: Option<&str>,
        me: &str,
    ) -> Result<Option<String>, &'static str> {
        if !self.is_set() {
            return Ok(None);
        }
        let token = token.ok_or("missing peer token")?;
        let Token {
            sender,
            run,
            seq,
            ms,
        } = self.authentic(token, me)?;
        let now = self.unix_ms();
        if now.abs_diff(ms) > self.0.window.as_millis() as u64 {
            return Err(EXPIRED);
        }
        self.0
            .replays
            .lock()
            .map_err(|_| "replay window lock poisoned")?
            .accept(sender, run, seq, now)
            .map_err(|r| r.reason())?;
        Ok(Some(sender.to_string()))
    }

    /// For a token refused at node `me` as [`EXPIRED`]: this node's clock
    /// (ms since the epoch) and a MAC over it, `me` and the token,
    /// `ms:mac` — the [`CLOCK_HEADER`] of the refusal. Its sender then
    /// stamps its tokens for this node on this node's clock
    /// ([`Secret::read_clock_word`]), so a node whose wall clock stepped
    /// or drifted past the window keeps talking to its peers (as a
    /// Kerberos client corrects by the server's time in a skew error)
    /// instead of standing in the ring unreachable. The window still
    /// bounds a token's worth on the receiver's clock, and a token for
    /// this node is worth nothing at another. None for a token that is
    /// not authentic.
    pub fn clock_word(&self, token: &str, me: &str) -> Option<String> {
        let t = self.authentic(token, me).ok()?;
        let now = self.unix_ms();
        let tag = self.mac(&[&clock_message(t.sender, me, t.run, t.seq, now)])?;
        Some(format!("{now}:{}", hex(&tag)))
    }

    /// The offset (ms) of `peer`'s clock from this node's, from the clock
    /// word its refusal of this node's token `seq`, sent as `sender`,
    /// carried. None unless the word is that peer's answer to that token.
    pub fn read_clock_word(&self, sender: &str, peer: &str, seq: u64, word: &str) -> Option<i64> {
        let (ms, tag) = word.split_once(':')?;
        let ms = ms.parse::<u64>().ok()?;
        let tag = unhex(tag)?;
        let message = clock_message(sender, peer, self.0.run, seq, ms);
        if !self.is_set() || !self.verify(&[&message], &tag) {
            return None;
        }
        Some(ms as i64 - self.unix_ms() as i64)
    }
}

/// What a clock word's MAC covers: the answering node's id and time and
/// the refused token's sender, run and sequence — so only that token's
/// sender can read it, for that call to that node (a word captured off
/// the wire, or another node's, fits no other).
fn clock_message(sender: &str, receiver: &str, run: u64, seq: u64, now_ms: u64) -> Vec<u8> {
    mac_message(b"sluice-clock-v1", &[sender, receiver], [run, seq, now_ms])
}

/// A peer token's parts.
struct Token<'a> {
    sender: &'a str,
    run: u64,
    seq: u64,
    ms: u64,
}

/// The bytes a peer token's MAC covers: the sender, and — from peer
/// protocol 3 on — the receiver (a token captured off the wire is worth
/// nothing at another node), each length-prefixed so no two tokens share
/// them.
fn token_message(sender: &str, receiver: Option<&str>, run: u64, seq: u64, ms: u64) -> Vec<u8> {
    match receiver {
        Some(receiver) => mac_message(b"sluice-peer-v3", &[sender, receiver], [run, seq, ms]),
        None => mac_message(b"sluice-peer-v2", &[sender], [run, seq, ms]),
    }
}

fn mac_message(domain: &[u8], names: &[&str], numbers: [u64; 3]) -> Vec<u8> {
    let mut m =
        Vec::with_capacity(domain.len() + 40 + names.iter().map(|n| n.len() + 8).sum::<usize>());
    m.extend_from_slice(domain);
    for name in names {
        m.extend_from_slice(&(name.len() as u64).to_le_bytes());
        m.extend_from_slice(name.as_bytes());
    }
    for n in numbers {
        m.extend_from_slice(&n.to_le_bytes());
    }
    m
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

/// chitchat's UDP transport with MACed datagrams, over a port bound in
/// advance (so a node started on port 0 knows its gossip port before it
/// builds its chitchat id). Each `open` hands chitchat its own handle to the
/// one port, so gossip can restart (a rejoin) on the same port.
pub struct AuthTransport {
    socket: Arc<dyn Datagrams>,
    secret: Secret,
    faults: Arc<Faults>,
}

impl AuthTransport {
    pub fn new(socket: Arc<dyn Datagrams>, secret: Secret, faults: Arc<Faults>) -> AuthTransport {
        AuthTransport {
            socket,
            secret,
            faults,
        }
    }
}

#[async_trait]
impl Transport for AuthTransport {
    async fn open(&self, _listen_addr: SocketAddr) -> anyhow::Result<Box<dyn Socket>> {
        Ok(Box::new(AuthSocket {
            socket: self.socket.open()?,
            secret: self.secret.clone(),
            faults: self.faults.clone(),
            buf: vec![0; MAX_DATAGRAM],
        }))
    }
}

struct AuthSocket {
    socket: Box<dyn DatagramSocket>,
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
            // Not by construction (see `TRANSPORT_RESERVE` above): a bug in
            // the budget. Dropped: the next round sends a fresh delta.
            tracing::error!(
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
            if !self.secret.is_set() {
                // A node with no secret is alone (the config refuses seeds
                // without one): any datagram is an outsider's, and taking
                // it would let anyone announce a member the ring sends
                // keys to.
                tracing::debug!(%from, "gossip datagram to a node with no secret; dropped");
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
        assert_eq!(s.check_peer_token(Some(&t), "b"), Ok(Some("node:a".into())));
        let other = Secret::new(Some(b"other"));
        assert!(
            other
                .check_peer_token(Some(&s.peer_token("n").unwrap()), "b")
                .is_err()
        );
        assert!(s.check_peer_token(None, "b").is_err());
        assert!(s.check_peer_token(Some("a:1:2:3:zz"), "b").is_err());
        let stale = on_clock(b"k", -60).peer_token("n").unwrap();
        assert_eq!(s.check_peer_token(Some(&stale), "b"), Err(EXPIRED));
        assert_eq!(Secret::new(None).check_peer_token(None, "b"), Ok(None));
    }

    #[test]
    fn a_token_is_accepted_once() {
        let sender = Secret::new(Some(b"k"));
        let receiver = Secret::new(Some(b"k"));
        let first = sender.peer_token("a").unwrap();
        let second = sender.peer_token("a").unwrap();
        assert_ne!(first, second);
        assert!(receiver.check_peer_token(Some(&second), "b").is_ok());
        assert!(receiver.check_peer_token(Some(&first), "b").is_ok());
        assert_eq!(
            receiver.check_peer_token(Some(&first), "b"),
            Err("replayed peer token")
        );
        // A tampered field breaks the MAC.
        let forged = first.replacen(":0:", ":7:", 1);
        assert_eq!(
            receiver.check_peer_token(Some(&forged), "b"),
            Err("invalid peer token")
        );
    }

    fn on_clock(key: &[u8], offset_s: i64) -> Secret {
        Secret::with_clock(
            Some(key),
            TOKEN_WINDOW,
            Arc::new(SystemClock::with_offset(offset_s * 1_000_000_000)),
        )
    }

    #[test]
    fn a_token_for_one_node_is_worth_nothing_at_another() {
        let sender = Secret::new(Some(b"k"));
        let (token, _) = sender.peer_token_for("a", Some("b"), 0).unwrap();
        // Captured off the wire on its way to b, played at c: refused.
        let c = Secret::new(Some(b"k"));
        assert_eq!(
            c.check_peer_token(Some(&token), "c"),
            Err("invalid peer token")
        );
        let b = Secret::new(Some(b"k"));
        assert_eq!(b.check_peer_token(Some(&token), "b"), Ok(Some("a".into())));
        // An unbound token (the CLI's, a protocol-2 peer's) is good at any.
        let any = sender.peer_token("a").unwrap();
        assert_eq!(c.check_peer_token(Some(&any), "c"), Ok(Some("a".into())));
    }

    #[test]
    fn a_refusal_for_the_time_teaches_the_sender_the_receivers_clock() {
        // Ten minutes apart, either way: far past the window.
        for skew in [600, -600] {
            let sender = on_clock(b"k", 0);
            let receiver = on_clock(b"k", skew);
            let (token, seq) = sender.peer_token_for("a", Some("b"), 0).unwrap();
            assert_eq!(receiver.check_peer_token(Some(&token), "b"), Err(EXPIRED));
            let word = receiver.clock_word(&token, "b").unwrap();
            let offset = sender.read_clock_word("a", "b", seq, &word).unwrap();
            assert!(
                (offset - skew * 1_000).abs() < 1_000,
                "skew {skew} s read as {offset} ms"
            );
            // Stamped on the receiver's clock, the next token is taken.
            let (next, _) = sender.peer_token_for("a", Some("b"), offset).unwrap();
            assert_eq!(
                receiver.check_peer_token(Some(&next), "b"),
                Ok(Some("a".into()))
            );

            // The word answers that token only: not another of the
            // sender's, not another sender's, not as another node's
            // answer, not with its time changed, and not from a node
            // without the secret.
            assert_eq!(sender.read_clock_word("a", "b", seq + 1, &word), None);
            assert_eq!(sender.read_clock_word("x", "b", seq, &word), None);
            assert_eq!(sender.read_clock_word("a", "c", seq, &word), None);
            let (ms, tag) = word.split_once(':').unwrap();
            let moved = format!("{}:{tag}", ms.parse::<u64>().unwrap() + 1);
            assert_eq!(sender.read_clock_word("a", "b", seq, &moved), None);
            let outsider = on_clock(b"guess", skew);
            let theirs = outsider.clock_word(&outsider.peer_token("a").unwrap(), "b");
            assert_eq!(
                sender.read_clock_word("a", "b", seq, &theirs.unwrap()),
                None
            );
            // Another run of the sender (a restart) reads none of it.
            assert_eq!(
                on_clock(b"k", 0).read_clock_word("a", "b", seq, &word),
                None
            );
            // A token that is not authentic, or not for this node, gets
            // no word.
            assert_eq!(
                receiver.clock_word(&token.replacen(":0:", ":7:", 1), "b"),
                None
            );
            assert_eq!(receiver.clock_word(&token, "c"), None);
        }
    }
}
