//! A peer's connection, opened afresh when calls on it go unanswered.
//!
//! Every call to a peer shares one HTTP/2 connection, so one TCP stream.
//! After a cut or a lossy link heals, that stream may still hold data
//! the peer never acknowledged: TCP sends it again only at its
//! retransmission timeout, which backs off (seconds after a long cut),
//! and every call queued behind it times out meanwhile — replication
//! included, so a key's copy lags well past the fault (seeds 45 and 609
//! of the simulator: pushes timing out 320–650 ms after the heal). Each
//! timed-out call also resets its stream, and the peer's HTTP/2 server
//! answers a burst of resets by closing the connection
//! (`too_many_resets`). A fresh connection waits on none of this.
//!
//! So a connection on which [`SILENT_CALLS`] calls in a row got no
//! answer at all, and nothing answered for a whole gap, is replaced by a
//! new one for the calls after them. The gap doubles from [`FIRST_GAP`]
//! (or the connect timeout, if longer: a connection still opening is not
//! replaced) to [`LAST_GAP`] while nothing answers — a peer that is
//! paused, not cut off, accepts connections it never serves, and a
//! thousand nodes must not open them for it ten times a second — and
//! starts over once a connection has lasted its gap (or [`LASTING`]) and
//! answers. A node opens at most one such connection per [`SPACING`],
//! all peers together (its own runtime stalled, every peer looks silent
//! at once). A peer that answers some calls and not others
//! (starved, answering late) never goes a gap without an answer: its
//! connection stays. Whatever the peer sent — an answer or an error
//! status of its own — is an answer; an error tonic made here is
//! neither (a connection that failed, tonic opens again on its own).
//! Each call reports on the connection it used: calls still stuck on a
//! replaced one say nothing of the new one. They finish there (each has
//! its deadline); then it closes — HTTP/2 pings close one that never
//! drains (`KEEP_ALIVE`, in `mod.rs`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};

use crate::proto::peer::peer_client::PeerClient;

/// Unanswered calls in a row that may open a new connection: one call
/// lost to a slow peer is no stall.
pub(super) const SILENT_CALLS: u32 = 3;
/// The least time a connection goes without an answer before it is
/// replaced, and between two connections opened for silence.
pub(super) const FIRST_GAP: Duration = Duration::from_millis(100);
/// The most: what a peer that stays silent costs (one connection per
/// gap from each node), and how long after it heals a connection that
/// opened but stalled in the meantime may still wait (TCP itself resends
/// by then).
pub(super) const LAST_GAP: Duration = Duration::from_secs(10);
/// A connection that has lasted this long, or its own gap, and answers
/// starts the gap over: the peer is not silent. (Lasting 2 s alone was
/// not enough: on a lossy link each connection was renewed before it, the
/// gap grew to seconds, and after the loss ended a backlogged connection
/// waited that long — seed 735 of `--mix any`.)
pub(super) const LASTING: Duration = Duration::from_secs(2);
/// The least time between two connections a node opens for silence, to
/// any peers.
pub(super) const SPACING: Duration = Duration::from_millis(50);

/// When this node last opened a connection for silence (any peer's):
/// shared by every peer's link.
#[derive(Default)]
pub(super) struct Renewals {
    /// A std Mutex: taken after a link's own, never across an await.
    last: Mutex<Option<Instant>>,
}

impl Renewals {
    /// Whether a renewal may go now (and it is counted).
    fn take(&self, now: Instant) -> bool {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_some_and(|t| now.duration_since(t) < SPACING) {
            return false;
        }
        *last = Some(now);
        true
    }
}

/// A peer's client, renewed when it stalls; shared by the peer's calls.
pub(super) struct Link {
    endpoint: Endpoint,
    connector: Option<crate::net::Connector>,
    /// The first gap: [`FIRST_GAP`], or the connect timeout if longer.
    first: Duration,
    renewals: Arc<Renewals>,
    /// A std Mutex: taken to clone or swap the client and count, never
    /// across an await.
    state: Mutex<State>,
}

struct State {
    client: PeerClient<Channel>,
    /// Which connection `client` is (one more per renewal): a call
    /// reports on the one it used.
    number: u64,
    /// Calls in a row on it that got no answer.
    silent: u32,
    /// When it was opened.
    opened: Instant,
    /// When it last answered (its opening, before any answer).
    heard: Instant,
    /// The silence before the next renewal.
    gap: Duration,
}

/// What became of a call, as its connection's health reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Heard {
    /// The peer answered (with its answer or an error status of its own).
    Answer,
    /// The deadline passed with no answer.
    Nothing,
    /// An error made here (the connection failed; tonic reconnects).
    Local,
}

impl Heard {
    /// An error status's reading: tonic's own deadline (a `Cancelled`
    /// status whose source chain holds `TimeoutExpired` — tonic enforces
    /// the call's `grpc-timeout` itself, most often before the caller's
    /// timer does) is no answer; a status with no source came from the
    /// peer; any other was made here.
    pub(super) fn of(status: &tonic::Status) -> Heard {
        let mut source = std::error::Error::source(status);
        if source.is_none() {
            return Heard::Answer;
        }
        while let Some(e) = source {
            if e.is::<tonic::TimeoutExpired>() {
                return Heard::Nothing;
            }
            source = e.source();
        }
        Heard::Local
    }
}

impl Link {
    pub(super) fn new(
        endpoint: Endpoint,
        connector: Option<crate::net::Connector>,
        connect_timeout: Duration,
        renewals: Arc<Renewals>,
    ) -> Link {
        let client = open(&endpoint, &connector);
        let now = Instant::now();
        let first = FIRST_GAP.max(connect_timeout);
        Link {
            endpoint,
            connector,
            first,
            renewals,
            state: Mutex::new(State {
                client,
                number: 0,
                silent: 0,
                opened: now,
                heard: now,
                gap: first,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The client for one call (a clone: cheap, it shares the channel),
    /// and which connection it is.
    pub(super) fn client(&self) -> (PeerClient<Channel>, u64) {
        let s = self.lock();
        (s.client.clone(), s.number)
    }

    /// What became of a call on connection `number`. Whether a new
    /// connection was opened for the calls after it.
    pub(super) fn heard(&self, number: u64, heard: Heard) -> bool {
        self.heard_at(number, heard, Instant::now())
    }

    fn heard_at(&self, number: u64, heard: Heard, now: Instant) -> bool {
        let mut s = self.lock();
        if number != s.number {
            return false;
        }
        match heard {
            Heard::Local => false,
            Heard::Answer => {
                s.silent = 0;
                s.heard = now;
                if now.duration_since(s.opened) >= LASTING.min(s.gap) {
                    s.gap = self.first;
                }
                false
            }
            Heard::Nothing => {
                s.silent = s.silent.saturating_add(1);
                if s.silent < SILENT_CALLS
                    || now.duration_since(s.heard) < s.gap
                    || !self.renewals.take(now)
                {
                    return false;
                }
                s.client = open(&self.endpoint, &self.connector);
                s.number += 1;
                s.silent = 0;
                s.opened = now;
                s.heard = now;
                s.gap = (s.gap * 2).min(LAST_GAP);
                true
            }
        }
    }
}

/// A lazy channel: it connects on its first call, and again after a
/// connection error (tonic's own reconnect).
fn open(endpoint: &Endpoint, connector: &Option<crate::net::Connector>) -> PeerClient<Channel> {
    let channel = match connector {
        None => endpoint.connect_lazy(),
        Some(c) => endpoint.connect_with_connector_lazy(c.clone()),
    };
    PeerClient::new(channel)
}

#[cfg(test)]
mod tests {
    use super::*;
    use Heard::{Answer, Local, Nothing};

    /// A link and its clock: the tests move `now` by hand.
    fn link() -> (Link, Instant) {
        link_with(Arc::default())
    }

    fn link_with(renewals: Arc<Renewals>) -> (Link, Instant) {
        let endpoint = Endpoint::from_static("http://127.0.0.1:1");
        let l = Link::new(endpoint, None, Duration::from_millis(10), renewals);
        let now = l.lock().opened;
        (l, now)
    }

    /// `n` silent calls on connection `number` at `now`: whether the last
    /// renewed it (none before it may).
    fn silent(l: &Link, number: u64, n: u32, now: Instant) -> bool {
        for _ in 1..n {
            assert!(!l.heard_at(number, Nothing, now));
        }
        l.heard_at(number, Nothing, now)
    }

    #[tokio::test]
    async fn a_gap_of_silence_and_three_silent_calls_open_a_new_connection() {
        let (l, mut now) = link();
        // Three silent calls, but not a gap of silence yet.
        now += FIRST_GAP / 2;
        assert!(!silent(&l, 0, SILENT_CALLS, now));
        // A gap of silence: the next silent call renews.
        now += FIRST_GAP / 2;
        assert!(l.heard_at(0, Nothing, now));
        assert_eq!(l.client().1, 1);
        // The gap doubles while nothing answers: refused short of it at
        // each step, taken at it, up to the last gap.
        let gaps = [200, 400, 800, 1_600, 3_200, 6_400, 10_000, 10_000];
        for (number, gap) in (1..).zip(gaps) {
            let gap = Duration::from_millis(gap);
            now += gap - Duration::from_millis(1);
            assert!(
                !silent(&l, number, SILENT_CALLS, now),
                "renewed short of {gap:?}"
            );
            now += Duration::from_millis(1);
            assert!(l.heard_at(number, Nothing, now), "not renewed at {gap:?}");
        }
        assert_eq!(l.lock().gap, LAST_GAP);
    }

    #[tokio::test]
    async fn a_peer_that_answers_now_and_then_keeps_its_connection() {
        let (l, mut now) = link();
        // Starved: two calls in three answered late, for a minute.
        for _ in 0..600 {
            now += FIRST_GAP;
            assert!(!l.heard_at(0, Nothing, now));
            assert!(!l.heard_at(0, Nothing, now));
            assert!(!l.heard_at(0, Answer, now));
        }
        // An error made here says nothing either way.
        now += FIRST_GAP;
        assert!(!silent(&l, 0, 2, now));
        assert!(!l.heard_at(0, Local, now));
        assert!(!l.heard_at(0, Answer, now));
        assert!(!silent(&l, 0, 2, now));
        assert_eq!(l.client().1, 0);
    }

    #[tokio::test]
    async fn calls_on_a_replaced_connection_say_nothing_of_the_new_one() {
        let (l, mut now) = link();
        now += FIRST_GAP;
        assert!(silent(&l, 0, SILENT_CALLS, now));
        // Calls still stuck on connection 0 time out, then one answers
        // late: connection 1 counts none of it.
        now += LASTING;
        assert!(!silent(&l, 0, 10, now));
        assert!(!l.heard_at(0, Answer, now));
        assert_eq!(l.lock().silent, 0);
        assert_eq!(l.lock().heard, now - LASTING);
        // Its own calls do.
        assert!(silent(&l, 1, SILENT_CALLS, now));
        assert_eq!(l.client().1, 2);
    }

    #[tokio::test]
    async fn an_answer_on_a_lasting_connection_starts_the_gap_over() {
        let (l, mut now) = link();
        now += FIRST_GAP;
        assert!(silent(&l, 0, SILENT_CALLS, now));
        // Connection 1 answers at once: the gap stays doubled...
        assert!(!l.heard_at(1, Answer, now));
        assert_eq!(l.lock().gap, FIRST_GAP * 2);
        // ...until it has lasted its gap.
        now += FIRST_GAP * 2 - Duration::from_millis(1);
        assert!(!l.heard_at(1, Answer, now));
        assert_eq!(l.lock().gap, FIRST_GAP * 2);
        now += Duration::from_millis(1);
        assert!(!l.heard_at(1, Answer, now));
        assert_eq!(l.lock().gap, FIRST_GAP);
        // A gap past `LASTING` starts over once the connection lasted that.
        for _ in 0..7 {
            now += LAST_GAP;
            let n = l.client().1;
            assert!(silent(&l, n, SILENT_CALLS, now));
        }
        assert_eq!(l.lock().gap, LAST_GAP);
        now += LASTING;
        assert!(!l.heard_at(l.client().1, Answer, now));
        assert_eq!(l.lock().gap, FIRST_GAP);
    }

    #[tokio::test]
    async fn the_first_gap_covers_the_connect_timeout() {
        let endpoint = Endpoint::from_static("http://127.0.0.1:1");
        let l = Link::new(endpoint, None, Duration::from_millis(300), Arc::default());
        let mut now = l.lock().opened;
        now += Duration::from_millis(299);
        assert!(
            !silent(&l, 0, SILENT_CALLS, now),
            "a connection still opening"
        );
        now += Duration::from_millis(1);
        assert!(l.heard_at(0, Nothing, now));
        assert_eq!(l.lock().gap, Duration::from_millis(600));
    }

    #[tokio::test]
    async fn a_node_opens_one_connection_for_silence_per_spacing_over_all_peers() {
        let renewals = Arc::new(Renewals::default());
        let (a, mut now) = link_with(renewals.clone());
        let (b, _) = link_with(renewals);
        now += FIRST_GAP;
        assert!(silent(&a, 0, SILENT_CALLS, now));
        // Due too, but within the spacing of a's renewal.
        assert!(!silent(&b, 0, SILENT_CALLS, now));
        now += SPACING;
        assert!(b.heard_at(0, Nothing, now));
    }

    /// An error whose source is `inner`, as tonic's transport wraps one.
    #[derive(Debug)]
    struct Wrapped(Box<dyn std::error::Error + Send + Sync>);
    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "transport error")
        }
    }
    impl std::error::Error for Wrapped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&*self.0)
        }
    }

    #[test]
    fn tonics_own_deadline_is_no_answer_a_peers_status_is_one_and_a_local_error_neither() {
        let expired =
            tonic::Status::from_error(Box::new(Wrapped(Box::new(tonic::TimeoutExpired(())))));
        assert_eq!(expired.code(), tonic::Code::Cancelled);
        assert_eq!(Heard::of(&expired), Nothing);
        // Parsed from the peer's trailers: no source.
        assert_eq!(
            Heard::of(&tonic::Status::cancelled("Timeout expired")),
            Answer
        );
        assert_eq!(
            Heard::of(&tonic::Status::resource_exhausted("full")),
            Answer
        );
        let refused = tonic::Status::from_error(Box::new(Wrapped(Box::new(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        )))));
        assert_eq!(Heard::of(&refused), Local);
    }
}
