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
//! So calls that get no answer at all, [`SILENT_CALLS`] in a row, open a
//! new connection for the calls after them — at most once per gap, the
//! gap doubling from [`FIRST_GAP`] to [`LAST_GAP`] while nothing answers
//! (a peer that is paused, not cut off, accepts connections it never
//! serves: they are not opened for it ten times a second). An answer
//! shows the connection carries both ways and starts the count over; an
//! error status neither (a connection that failed, tonic opens again on
//! its own). Calls in flight keep the old connection until they end
//! (each has its deadline); then it closes.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};

use crate::proto::peer::peer_client::PeerClient;

/// Unanswered calls in a row that open a new connection: one call lost
/// to a slow peer is no stall.
pub(super) const SILENT_CALLS: u32 = 3;
/// The least time between two connections opened for silence.
pub(super) const FIRST_GAP: Duration = Duration::from_millis(100);
/// The most: what a peer that stays silent costs (one connection per
/// gap), and how long after it heals a connection that opened but
/// stalled in the meantime may still wait.
pub(super) const LAST_GAP: Duration = Duration::from_secs(2);

/// A peer's client, renewed when it stalls; shared by the peer's calls.
pub(super) struct Link {
    endpoint: Endpoint,
    connector: Option<crate::net::Connector>,
    /// A std Mutex: taken to clone or swap the client and count, never
    /// across an await.
    state: Mutex<State>,
}

struct State {
    client: PeerClient<Channel>,
    /// Calls in a row that got no answer.
    silent: u32,
    /// When the client was opened.
    opened: Instant,
    /// The gap before the next renewal.
    gap: Duration,
}

impl Link {
    pub(super) fn new(endpoint: Endpoint, connector: Option<crate::net::Connector>) -> Link {
        let client = open(&endpoint, &connector);
        Link {
            endpoint,
            connector,
            state: Mutex::new(State {
                client,
                silent: 0,
                opened: Instant::now(),
                gap: FIRST_GAP,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The client for one call (a clone: cheap, it shares the channel).
    pub(super) fn client(&self) -> PeerClient<Channel> {
        self.lock().client.clone()
    }

    /// A call got its answer. The gap starts over only once the
    /// connection answering has lasted [`LAST_GAP`]: a peer whose calls
    /// flap between answered and silent (a starved node answering late)
    /// is not sent a new connection every [`FIRST_GAP`].
    pub(super) fn answered(&self) {
        self.answered_at(Instant::now())
    }

    fn answered_at(&self, now: Instant) {
        let mut s = self.lock();
        s.silent = 0;
        if now.duration_since(s.opened) >= LAST_GAP {
            s.gap = FIRST_GAP;
        }
    }

    /// A call got no answer within its deadline. Whether a new connection
    /// was opened for the calls after it.
    pub(super) fn unanswered(&self) -> bool {
        self.unanswered_at(Instant::now())
    }

    fn unanswered_at(&self, now: Instant) -> bool {
        let mut s = self.lock();
        s.silent = s.silent.saturating_add(1);
        if s.silent < SILENT_CALLS || now.duration_since(s.opened) < s.gap {
            return false;
        }
        s.client = open(&self.endpoint, &self.connector);
        s.silent = 0;
        s.opened = now;
        s.gap = (s.gap * 2).min(LAST_GAP);
        true
    }
}

/// Whether a call's error is its deadline passing with no answer: tonic's
/// client enforces the call's `grpc-timeout` itself (a `Cancelled` status
/// whose source is `TimeoutExpired`), most often before the caller's own
/// timer does.
pub(super) fn timed_out(status: &tonic::Status) -> bool {
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
        if e.is::<tonic::TimeoutExpired>() {
            return true;
        }
        source = e.source();
    }
    false
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

    /// A link and its clock: the tests move `now` by hand.
    fn link() -> (Link, Instant) {
        let l = Link::new(Endpoint::from_static("http://127.0.0.1:1"), None);
        let now = l.lock().opened;
        (l, now)
    }

    #[tokio::test]
    async fn silence_opens_a_new_connection_at_most_once_per_growing_gap() {
        let (l, mut now) = link();
        now += FIRST_GAP;
        assert!(!l.unanswered_at(now));
        assert!(!l.unanswered_at(now));
        assert!(
            l.unanswered_at(now),
            "the third silent call in a row renews"
        );
        // The gap has doubled: three more silent calls at once do not.
        for _ in 0..SILENT_CALLS {
            assert!(!l.unanswered_at(now));
        }
        now += FIRST_GAP * 2;
        assert!(
            l.unanswered_at(now),
            "past the doubled gap, the next silent call renews"
        );
        // The gap stops growing at its bound.
        for _ in 0..10 {
            now += LAST_GAP;
            for _ in 0..SILENT_CALLS - 1 {
                assert!(!l.unanswered_at(now));
            }
            assert!(l.unanswered_at(now));
        }
        assert_eq!(l.lock().gap, LAST_GAP);
    }

    #[test]
    fn tonics_own_deadline_reads_as_no_answer_and_a_peers_status_does_not() {
        let expired = tonic::Status::from_error(Box::new(tonic::TimeoutExpired(())));
        assert_eq!(expired.code(), tonic::Code::Cancelled);
        assert!(timed_out(&expired));
        assert!(!timed_out(&tonic::Status::cancelled("Timeout expired")));
        assert!(!timed_out(&tonic::Status::unavailable(
            "connection refused"
        )));
    }

    #[tokio::test]
    async fn an_answer_starts_the_count_over_and_a_lasting_connection_the_gap() {
        let (l, mut now) = link();
        now += LAST_GAP;
        assert!(!l.unanswered_at(now));
        assert!(!l.unanswered_at(now));
        l.answered_at(now);
        assert!(
            !l.unanswered_at(now),
            "the silent calls before an answer do not count"
        );
        assert!(!l.unanswered_at(now));
        assert!(l.unanswered_at(now));
        // The new connection answers at once: the gap stays doubled (a
        // flapping peer gets no new connection every first gap)...
        l.answered_at(now);
        assert_eq!(l.lock().gap, FIRST_GAP * 2);
        now += FIRST_GAP;
        for _ in 0..SILENT_CALLS {
            assert!(!l.unanswered_at(now));
        }
        now += FIRST_GAP;
        assert!(l.unanswered_at(now));
        // ...until a connection that answers has lasted the last gap.
        now += LAST_GAP;
        l.answered_at(now);
        assert_eq!(l.lock().gap, FIRST_GAP);
        now += FIRST_GAP;
        for _ in 0..SILENT_CALLS - 1 {
            assert!(!l.unanswered_at(now));
        }
        assert!(
            l.unanswered_at(now),
            "after a lasting answer the first gap applies again"
        );
    }
}
