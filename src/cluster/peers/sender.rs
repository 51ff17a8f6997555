//! One peer's calls: each RPC authenticated, bounded by a deadline, run
//! through the test fault hook and fed to the peer's breaker — never
//! retried (at most once). The batcher and `Peers` in `mod.rs` decide what
//! to send; this file how one call goes.

use super::*;
use link::Heard;

/// A peer clock further off than this is warned about: decisions stay
/// right (owners decide on their own clock, deadlines travel as budgets),
/// but replicas and handoffs carry times, and an operator should know.
/// Cleared below [`CLOCK_CLEAR`] (no flapping near the bound).
const CLOCK_WARN: Duration = Duration::from_millis(250);
const CLOCK_CLEAR: Duration = Duration::from_millis(200);
/// A sample from a call slower than this is dropped: the peer stamps its
/// time after deciding, so a slow call skews the midpoint.
const CLOCK_MAX_RTT: u64 = 50_000_000;

impl Sender {
    /// The deadline, token and membership of a peer call; the token's
    /// sequence number (what a refusal's clock word answers).
    fn authorize<T>(&self, request: &mut tonic::Request<T>, timeout: Duration) -> Option<u64> {
        request.set_timeout(timeout);
        let offset = self.token_offset_ms.load(Ordering::Relaxed);
        // Good at this peer only, where it knows how (protocol 3).
        let receiver = (self.protocol >= 3).then_some(&*self.node_id);
        let mut seq = None;
        if let Some((token, s)) = self.secret.peer_token_for(&self.self_id, receiver, offset)
            && let Ok(value) = token.parse()
        {
            request.metadata_mut().insert(TOKEN_HEADER, value);
            seq = Some(s);
        }
        if let Some(p) = self.presence.get() {
            let mut member = p.generation().to_be_bytes().to_vec();
            member.extend_from_slice(self.self_id.as_bytes());
            request.metadata_mut().insert_bin(
                MEMBER_HEADER,
                tonic::metadata::MetadataValue::from_bytes(&member),
            );
        }
        seq
    }

    /// A refusal of this node's token as stamped outside the peer's window,
    /// with the peer's clock word: its next tokens are stamped on the
    /// peer's clock. The refused call did nothing there (the token is
    /// checked before anything else) and is not sent again — its caller
    /// sees it fail, once per clock step — as a refusal, not as the peer
    /// unreachable (its breaker counts nothing). Whether it was one.
    fn expired(&self, status: &tonic::Status, seq: Option<u64>) -> bool {
        let Some(word) = status
            .metadata()
            .get(CLOCK_HEADER)
            .and_then(|v| v.to_str().ok())
        else {
            return false;
        };
        let Some(offset) = seq.and_then(|seq| {
            self.secret
                .read_clock_word(&self.self_id, &self.node_id, seq, word)
        }) else {
            return false;
        };
        let was = self.token_offset_ms.swap(offset, Ordering::Relaxed);
        // Calls in flight together are refused together: one warning per
        // step of the clocks, not per call.
        if offset.abs_diff(was) > 1_000 {
            tracing::warn!(
                peer = %self.node_id,
                offset_s = offset as f64 / 1e3,
                was_s = was as f64 / 1e3,
                "a peer refused this node's token as outside its clock's window: stamping its tokens on its clock (check NTP on both)"
            );
        }
        true
    }

    /// A refusal that says this node's generation is buried: tell presence
    /// (the node owns nothing from now, and rejoins). Whether it was one.
    fn heard(&self, status: &tonic::Status) -> bool {
        let buried = status
            .metadata()
            .get(BURIED_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if let (Some(generation), Some(p)) = (buried, self.presence.get()) {
            tracing::warn!(peer = %self.node_id, generation, "a peer says this node's generation is buried");
            p.told_buried(generation);
        }
        buried.is_some()
    }

    /// What became of a call on connection `number`, for the link's
    /// health (`link.rs`).
    fn link_heard(&self, number: u64, heard: Heard) {
        if self.link.heard(number, heard) {
            self.metrics.connections_renewed.inc();
            tracing::info!(peer = %self.node_id, "calls to a peer went unanswered: opening a new connection to it");
        }
    }

    /// A test-injected cut behaves like a network that drops packets: the
    /// call times out (after `timeout`, the call's deadline).
    async fn cut(&self, timeout: Duration) -> Option<ForwardError> {
        if !self.faults.grpc_cut(&self.node_id) {
            return None;
        }
        tokio::time::sleep(timeout).await;
        Some(ForwardError::Unreachable {
            peer: self.node_id.to_string(),
            reason: "deadline exceeded (cut by a test fault)".into(),
        })
    }

    /// One RPC for `items`; never retried (at most once). Its outcome feeds
    /// the peer's breaker.
    pub(super) async fn send(
        &self,
        items: Vec<pb::ForwardItem>,
        probe: bool,
    ) -> Result<Vec<pb::ForwardResult>, ForwardError> {
        let attempt = Attempt::new(self, probe);
        let outcome = self.send_once(items).await;
        attempt.record(&outcome);
        outcome
    }

    /// One authenticated unary call with a deadline (`timeout`, else the
    /// forward timeout), fault hook and breaker (passed as `pass` says);
    /// never retried.
    pub(super) async fn call<Req, Resp, F, Fut>(
        &self,
        request: Req,
        timeout: Option<Duration>,
        pass: Pass,
        rpc: F,
    ) -> Result<Resp, ForwardError>
    where
        F: FnOnce(PeerClient<Channel>, tonic::Request<Req>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<Resp>, tonic::Status>>,
    {
        let attempt = Attempt::with(self, pass);
        self.metrics.rpc_attempt(&self.node_id);
        let timeout = timeout
            .unwrap_or(self.timeout)
            .max(Duration::from_millis(1));
        let outcome = match self.cut(timeout).await {
            Some(e) => Err(e),
            None => {
                let mut request = tonic::Request::new(request);
                let seq = self.authorize(&mut request, timeout);
                let (client, number) = self.link.client();
                match tokio::time::timeout(timeout, rpc(client, request)).await {
                    Ok(Ok(r)) => {
                        self.link_heard(number, Heard::Answer);
                        Ok(r.into_inner())
                    }
                    Ok(Err(status)) => {
                        self.link_heard(number, Heard::of(&status));
                        Err(self.failed(&status, seq))
                    }
                    Err(_) => {
                        self.link_heard(number, Heard::Nothing);
                        Err(ForwardError::Unreachable {
                            peer: self.node_id.to_string(),
                            reason: "deadline exceeded".to_string(),
                        })
                    }
                }
            }
        };
        attempt.record(&outcome);
        outcome
    }

    /// A call's error status as a forward error: a refusal for the call's
    /// size or shape (the peer answered) is not unreachability.
    fn failed(&self, status: &tonic::Status, seq: Option<u64>) -> ForwardError {
        self.heard(status);
        let expired = self.expired(status, seq);
        let peer = self.node_id.to_string();
        let reason = format!("{}: {}", status.code(), status.message());
        if expired {
            return ForwardError::Refused { peer, reason };
        }
        match status.code() {
            tonic::Code::ResourceExhausted
            | tonic::Code::InvalidArgument
            | tonic::Code::FailedPrecondition => ForwardError::Refused { peer, reason },
            _ => ForwardError::Unreachable { peer, reason },
        }
    }

    pub(super) async fn report(
        &self,
        items: Vec<pb::ReportItem>,
        probe: bool,
    ) -> Result<Vec<(i32, u64)>, ForwardError> {
        let n = items.len();
        let request = pb::ReportRequest {
            protocol_version: PEER_PROTOCOL_VERSION,
            from_node: self.self_id.to_string(),
            items,
        };
        let r = self
            .call(request, None, Pass::of(probe), |mut c, r| async move {
                c.report(r).await
            })
            .await?;
        if r.outcomes.len() != n {
            return Err(ForwardError::Unreachable {
                peer: self.node_id.to_string(),
                reason: "a wrong number of outcomes".into(),
            });
        }
        // `applied` is absent from owners before it: 0, a plain retry.
        let applied = r.applied.iter().copied().chain(std::iter::repeat(0));
        Ok(r.outcomes.into_iter().zip(applied).collect())
    }

    async fn send_once(
        &self,
        items: Vec<pb::ForwardItem>,
    ) -> Result<Vec<pb::ForwardResult>, ForwardError> {
        let n = items.len();
        let started = Instant::now();
        self.metrics.rpc_attempt(&self.node_id);
        // As long as the most patient of its callers waits (each item
        // carries its own budget; the owner drops those that run out).
        let timeout = items
            .iter()
            .map(|i| Duration::from_nanos(i.budget_ns))
            .max()
            .filter(|b| !b.is_zero())
            .unwrap_or(self.timeout)
            .max(Duration::from_millis(1));
        if let Some(e) = self.cut(timeout).await {
            self.metrics.forward_error(&self.node_id, "timeout");
            return Err(e);
        }
        let sent_at = self.clock.now();
        let mut request = tonic::Request::new(pb::ForwardRequest {
            protocol_version: PEER_PROTOCOL_VERSION,
            ring_epoch: self.epoch.load(Ordering::Relaxed),
            from_node: self.self_id.to_string(),
            items,
        });
        let seq = self.authorize(&mut request, timeout);
        let unreachable = |reason: String| ForwardError::Unreachable {
            peer: self.node_id.to_string(),
            reason,
        };
        let (mut client, number) = self.link.client();
        let outcome = tokio::time::timeout(timeout, client.forward(request)).await;
        self.metrics.forwarded(n, started.elapsed());
        self.figures.forwarded(started.elapsed());
        let response = match outcome {
            Err(_) => {
                self.link_heard(number, Heard::Nothing);
                self.metrics.forward_error(&self.node_id, "timeout");
                return Err(unreachable("deadline exceeded".into()));
            }
            Ok(Err(status)) => {
                self.link_heard(number, Heard::of(&status));
                self.metrics.forward_error(&self.node_id, "rpc");
                let expired = self.expired(&status, seq);
                if self.heard(&status) || expired {
                    // The peer answered: not a failure for its breaker.
                    return Err(ForwardError::Refused {
                        peer: self.node_id.to_string(),
                        reason: status.message().to_string(),
                    });
                }
                return Err(unreachable(format!(
                    "{}: {}",
                    status.code(),
                    status.message()
                )));
            }
            Ok(Ok(r)) => {
                self.link_heard(number, Heard::Answer);
                r.into_inner()
            }
        };
        self.observe_clock(sent_at, response.now_ns);
        if response.results.len() != n {
            self.metrics.forward_error(&self.node_id, "protocol");
            return Err(unreachable(format!(
                "answered {} results for {n} items",
                response.results.len()
            )));
        }
        Ok(response.results)
    }
}

impl Sender {
    /// The peer's clock offset, from its `now` in an answer against the
    /// call's midpoint on this node's clock (0: a peer that sends none).
    fn observe_clock(&self, sent_at: u64, peer_now: u64) {
        // A peer removed from the ring had its gauge dropped: a call still
        // in flight to it must not bring the gauge back.
        if peer_now == 0 || self.gone.is_cancelled() {
            return;
        }
        let received = self.clock.now();
        if received.saturating_sub(sent_at) > CLOCK_MAX_RTT {
            return;
        }
        let midpoint = sent_at / 2 + received / 2 + (sent_at % 2 + received % 2) / 2;
        let offset = peer_now as i128 - midpoint as i128;
        let seconds = offset as f64 / 1e9;
        self.metrics.clock_offset(&self.node_id, seconds);
        let off = offset.unsigned_abs() > CLOCK_WARN.as_nanos();
        let back = offset.unsigned_abs() < CLOCK_CLEAR.as_nanos();
        if off && !self.clock_warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                peer = %self.node_id,
                offset_s = seconds,
                "a peer's clock is off from this node's (check NTP on both)"
            );
        } else if back && self.clock_warned.swap(false, Ordering::Relaxed) {
            tracing::info!(peer = %self.node_id, offset_s = seconds, "peer clock back in step");
        }
    }
}

/// How a call got past its peer's breaker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Pass {
    Closed,
    /// The half-open breaker's probe.
    Probe,
    /// Past an open breaker (background work): its success closes the
    /// breaker, its failure leaves it as it is — each failure would
    /// otherwise start the cooldown again, and background calls every
    /// round would hold it open for requests for good.
    PastOpen,
}

impl Pass {
    pub(super) fn of(probe: bool) -> Pass {
        if probe { Pass::Probe } else { Pass::Closed }
    }
}

/// One call's record in its peer's breaker. A call whose future is dropped
/// before it finishes (its caller's deadline passed first) reports nothing
/// on its own: dropping the attempt frees the breaker's probe slot, or a
/// half-open breaker would refuse every call to that peer for good.
struct Attempt<'a> {
    sender: &'a Sender,
    pass: Pass,
    done: bool,
}

impl<'a> Attempt<'a> {
    fn new(sender: &'a Sender, probe: bool) -> Attempt<'a> {
        Attempt::with(sender, Pass::of(probe))
    }

    fn with(sender: &'a Sender, pass: Pass) -> Attempt<'a> {
        Attempt {
            sender,
            pass,
            done: false,
        }
    }

    fn record<T>(mut self, outcome: &Result<T, ForwardError>) {
        self.done = true;
        // A refusal came from a peer that answered: reachable.
        let reached = !matches!(outcome, Err(ForwardError::Unreachable { .. }));
        if reached || self.pass != Pass::PastOpen {
            self.sender.breaker.record(reached);
        }
        self.sender
            .metrics
            .breaker_state(&self.sender.node_id, self.sender.breaker.state().gauge());
    }
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        if !self.done && self.pass == Pass::Probe {
            self.sender.breaker.abandon();
        }
    }
}
