//! Allotments decided in this process (issue 23): tiered mode one step
//! further out.
//!
//! For a key in tiered mode the node this client talks to passes on part
//! of its own allotment (`sluice.v1.Allotments/Allot`): tokens this process
//! may spend without asking, until an expiry. A check they cover is decided
//! here — no RPC — by the same `Allotments` code a node runs
//! (`sluice-core`), and answered `approximate` with `path =
//! LocalAllotment`, `remaining` being this allotment. A check they do not
//! cover asks the node, which decides it exactly and grants the next
//! allotment, taking back what was left of the last.
//!
//! What was spent is reported asynchronously, one report in flight,
//! resent unchanged until acknowledged: the node applies each `(client id,
//! sequence)` once, so a lost acknowledgement never counts twice. The node
//! reports it on to the key's owner under its own id. A report rides on
//! the next ask (an allotment spent, the next one asked for) and costs no
//! call of its own; spending no ask carries goes in a `Report` of its own
//! when the allotment it was spent from ends. So an allotment's last hits
//! reach the node as soon as at a fixed 50 ms interval, within the grace
//! the node keeps a lapsed sub-grant's tokens reserved for (see
//! [`REPORT_TIMEOUT`]), and its earlier ones later than at that interval:
//! a report lost twice, or an app killed, costs up to one allotment's
//! spending (the limit admits that much more), where it cost 50 ms of it.
//!
//! The app is inside the limit's trust boundary: one that does not report
//! admits beyond the limit by at most what it was granted.
//!
//! Bounded: keys with allotments ([`crate::Builder::allotments`]), keys with
//! unreported spending (as many; a key beyond it is decided by the node),
//! items per report.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use sluice_api::v1 as pb;
use sluice_api::v1::allotments_client::AllotmentsClient;
use sluice_core::tiered::{Allotments, Grant, Local};
use tokio::sync::watch;
use tonic::transport::Channel;

use crate::{Check, Decision, Limit, Path, Source};

/// Keys a client holds allotments of, unless told otherwise.
pub const DEFAULT_ALLOTMENT_KEYS: usize = 10_000;

/// How soon a report that was not acknowledged is sent again. (Spending
/// itself is reported with the next ask, or when its allotment ends.)
pub const REPORT_EVERY: Duration = Duration::from_millis(50);

/// Items a report carried by an ask holds at most: the node applies it
/// before deciding the ask's check, which waits meanwhile. A larger one
/// goes in a `Report` of its own.
const CARRIED_ITEMS: usize = 16;

/// Items per report (a node refuses more than `limits.max_batch`, 1,000 by
/// default).
const REPORT_ITEMS: usize = 500;

/// A check that waited for its key's ask and still finds no tokens is
/// refused with this `retry_after` (ns): about a round trip to the node.
const REFUSED_AFTER_WAIT: u64 = 1_000_000;

/// How long a report may take before it is resent: within the node's
/// grace for a lapsed sub-grant (3 report rounds of the node's, 310 ms by
/// default), so one lost report does not hold every later one past it.
/// Spending is reported by the end of its allotment, which ends a one-way
/// trip before the node's sub-grant does (both are counted from the ask:
/// here from its sending, there from its arrival): a report lost then is
/// resent [`REPORT_TIMEOUT`] + [`REPORT_EVERY`] (250 ms) later, and reaches
/// the node inside that grace. An ask carries the report only if its
/// deadline is no longer than this, so an exchange that holds the report
/// is as bounded as a `Report` call.
const REPORT_TIMEOUT: Duration = Duration::from_millis(200);

/// Policies learned to be tiered, remembered at most.
const MAX_POLICIES: usize = 1_024;

/// After the node refused a key and granted nothing, this process refuses
/// that many of its next checks of the key itself before it asks again —
/// counted in checks, not time, so each app asks in proportion to its own
/// demand, and an exhausted key's refills are shared by demand rather than
/// by who asks. (A wait in time has every app ask at the same rate whatever
/// its demand: measured, a busy app with 80% of the demand got 59% of the
/// admissions.) Measured with the owner's demand-weighted split, busy
/// app's share at 80% of the demand: 8 gave 80–82% in
/// `tests/client_allotments.rs` (200/s) and 88% in
/// `benches/client_allotments.py` (1,000/s); 16 gave 87–89% and 85%; a
/// plain 30 ms wait gave 76% and 49%. So at most one in this many
/// refusals of an exhausted key costs a call.
const REFUSE_BEFORE_ASKING: u32 = 8;

/// ... and for no longer than this (an app whose demand is low asks again
/// at least this often).
const REFUSE_AT_MOST: Duration = Duration::from_millis(250);

/// Figures of this client's allotments (the app's metrics hook reads them).
#[derive(Debug, Default)]
pub struct AllotmentStats {
    /// Checks decided in process: admitted, refused.
    pub local_admitted: AtomicU64,
    pub local_refused: AtomicU64,
    /// Asks sent to the node (each decides one check exactly).
    pub asks: AtomicU64,
    /// Grants received, and their tokens.
    pub grants: AtomicU64,
    pub granted_tokens: AtomicU64,
    /// Reports sent (resends included), those of them carried by an ask,
    /// and how they were acknowledged.
    pub reports_sent: AtomicU64,
    pub reports_carried: AtomicU64,
    pub reports_applied: AtomicU64,
    pub reports_duplicate: AtomicU64,
    pub reports_invalid: AtomicU64,
    /// Hits spent in process and not yet acknowledged (a gauge).
    pub unreported_hits: AtomicU64,
}

/// What this client knows of one allotted key.
struct Key {
    /// The request the key was asked with (hits unset): what its spending
    /// is reported under.
    request: pb::RateLimitRequest,
    limit: u64,
    window: Duration,
}

/// Hits by key (a report's).
type PerKey = Vec<(Arc<[u8]>, u64)>;

struct Table {
    allotments: Allotments,
    keys: HashMap<Arc<[u8]>, Key>,
    /// Policies whose answers came from tiered mode: their checks use
    /// allotments with no change in the app.
    tiered_policies: HashSet<String>,
    /// Spent since the last report was cut.
    pending: HashMap<Arc<[u8]>, u64>,
    /// When the first of the allotments `pending` was spent from ends: it
    /// is reported by then (None: nothing pending).
    due: Option<u64>,
    /// Keys the node just refused: refusals left before asking again, and
    /// until when at most.
    cooling: HashMap<Arc<[u8]>, (u32, u64)>,
    /// Keys with an ask in flight (its number, and what ends when it
    /// does): one ask per key at a time, the checks that find one waiting
    /// for its grant instead of asking too — concurrent asks of a busy app
    /// would each be decided first-come at the node, all but one refused.
    asking: HashMap<Arc<[u8]>, (u64, watch::Receiver<Asked>)>,
    next_ask: u64,
    /// The report cut and not yet acknowledged, and its hits by key.
    in_flight: Option<(pb::ReportRequest, PerKey)>,
    /// When the report in flight is resent, once an exchange of it ended
    /// unacknowledged: a time, not a wait, so wakeups meanwhile do not put
    /// it off.
    resend_at: Option<u64>,
    next_seq: u64,
}

/// The allotments of one client; shared by its handles and its reporter.
pub(crate) struct Allotter {
    id: String,
    rpc: AllotmentsClient<Channel>,
    started: Instant,
    /// Off once a node answers UNIMPLEMENTED (it serves no allotments).
    on: AtomicBool,
    max_keys: usize,
    /// A std mutex: held for a map lookup and some arithmetic, never
    /// across an await.
    table: Mutex<Table>,
    /// One report exchange at a time (the reporter's, an ask carrying the
    /// report, or a flush asked for by the app): a tokio mutex, as it is
    /// held across the call.
    reporting: tokio::sync::Mutex<()>,
    /// Wakes the reporter: spending began to wait for a report (it sleeps
    /// until it is due), or the client is gone.
    pub(crate) wake: Arc<tokio::sync::Notify>,
    pub(crate) stats: Arc<AllotmentStats>,
}

/// What the table says about one check.
pub(crate) enum Spend<'a> {
    /// Decided here.
    Decided(Decision),
    /// Ask the node, with this demand, giving back this much; the key's
    /// ask is in flight until `asking` is dropped.
    Ask {
        demand: u64,
        unused: u64,
        asking: Asking<'a>,
    },
    /// Another check's ask of this key is in flight: wait for it to end
    /// (`changed` returns when it has), then see how it ended.
    Wait(watch::Receiver<Asked>),
    /// Not for allotments (a bound is reached): decide it as usual.
    Bypass,
}

/// How a key's ask ended, for the checks that waited for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Asked {
    /// Still out (or dropped before it said: cancelled).
    Pending,
    /// The node answered: spend what it brought, else refuse.
    Answered,
    /// No answer (the call failed or timed out): decide as the asker did.
    Failed,
}

/// A key's ask in flight; dropped (answered, failed or cancelled), it
/// lets the checks waiting for it go on, told how it ended.
pub(crate) struct Asking<'a> {
    allotter: &'a Allotter,
    key: Arc<[u8]>,
    id: u64,
    done: watch::Sender<Asked>,
    /// Its id as a paced ask ([`Local::Ask`]), if it is one.
    pub(crate) pace: Option<u64>,
}

impl Asking<'_> {
    /// Say how the ask ended (before it is dropped).
    pub(crate) fn ended(&self, how: Asked) {
        self.done.send_replace(how);
    }
}

impl Drop for Asking<'_> {
    fn drop(&mut self) {
        let mut t = self.allotter.table();
        if t.asking
            .get(&self.key)
            .is_some_and(|(id, _)| *id == self.id)
        {
            t.asking.remove(&self.key);
        }
        if let Some(pace) = self.pace {
            t.allotments.ask_done(&self.key, pace);
        }
    }
}

/// An ask carrying a report it cut (it holds the report exchange);
/// dropped with the report still unacknowledged (the call failed, was
/// cancelled, or the node said to resend it), it leaves the report to the
/// reporter, which resends it [`REPORT_EVERY`] later — no later ask
/// carries it (a node slower than the asks' deadline would otherwise see
/// it only on asks that time out).
struct Carrying<'a> {
    allotter: &'a Allotter,
    _one: tokio::sync::MutexGuard<'a, ()>,
}

impl Drop for Carrying<'_> {
    fn drop(&mut self) {
        let now = self.allotter.now();
        let unacknowledged = {
            let mut t = self.allotter.table();
            let unacknowledged = t.in_flight.is_some();
            if unacknowledged {
                t.resend_at = Some(resend_after(now));
            }
            unacknowledged
        };
        if unacknowledged {
            self.allotter.wake.notify_one();
        }
    }
}

/// Tokens given back by an ask that is not sent after all: kept to give
/// back with the next one (never spent: too few for the check, or expired).
fn keep_unused(t: &mut Table, k: &[u8], unused: u64) {
    if unused > 0 {
        t.allotments.keep(k, unused);
    }
}

/// The table's key for a counter: name and key, length-prefixed (as the
/// node's), so ("a/b","c") and ("a","b/c") differ.
fn encode(check: &Check) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + check.name.len() + check.key.len());
    k.extend_from_slice(&(check.name.len() as u64).to_le_bytes());
    k.extend_from_slice(check.name.as_bytes());
    k.extend_from_slice(check.key.as_bytes());
    k
}

/// An id for this client: random enough that two processes never share
/// one (the node applies reports once per id and sequence), from the
/// process id, the time and std's randomly seeded hasher.
pub(crate) fn client_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    h.write_u128(nanos);
    let a = h.finish();
    h.write_u64(a);
    format!("{:016x}{:016x}-{}", a, h.finish(), std::process::id())
}

impl Allotter {
    pub(crate) fn new(id: String, channel: Channel, max_keys: usize) -> Allotter {
        Allotter {
            id,
            rpc: AllotmentsClient::new(channel),
            started: Instant::now(),
            on: AtomicBool::new(true),
            max_keys: max_keys.max(1),
            table: Mutex::new(Table {
                allotments: Allotments::new(max_keys.max(1)),
                keys: HashMap::new(),
                tiered_policies: HashSet::new(),
                pending: HashMap::new(),
                due: None,
                cooling: HashMap::new(),
                asking: HashMap::new(),
                next_ask: 0,
                in_flight: None,
                resend_at: None,
                next_seq: 1,
            }),
            reporting: tokio::sync::Mutex::new(()),
            wake: Arc::new(tokio::sync::Notify::new()),
            stats: Arc::new(AllotmentStats::default()),
        }
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// This process's monotonic time, in ns since the client was built.
    fn now(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Whether `check` is decided on allotments: asked tiered, or of a
    /// policy the node decides in tiered mode.
    pub(crate) fn applies(&self, check: &Check) -> bool {
        if !self.on.load(Ordering::Relaxed) {
            return false;
        }
        check.tiered
            || match &check.limit {
                Limit::Policy(p) => self.table().tiered_policies.contains(p),
                Limit::Inline { .. } => false,
            }
    }

    /// The node answered a check of `policy` from tiered mode: its later
    /// checks use allotments.
    pub(crate) fn learn(&self, check: &Check, path: i32) {
        let tiered = path == pb::Path::LocalAllotment as i32 || path == pb::Path::Slow as i32;
        if let (true, Limit::Policy(p)) = (tiered, &check.limit) {
            let mut t = self.table();
            if t.tiered_policies.len() < MAX_POLICIES && !t.tiered_policies.contains(p) {
                t.tiered_policies.insert(p.clone());
            }
        }
    }

    /// Spend `check` from its allotment, or say what to ask.
    /// `waited`: this check already waited for an ask of its key, whose
    /// answer is in: what it left cannot cover the check, so it is refused
    /// here rather than asked again (an app's checks that arrive during
    /// one ask are decided by that ask's grant, as a node's callers are by
    /// its own).
    pub(crate) fn spend(&self, check: &Check, waited: bool) -> Spend<'_> {
        let k = encode(check);
        let now = self.now();
        let mut t = self.table();
        if !t.pending.contains_key(&k[..]) && t.pending.len() >= self.max_keys {
            return Spend::Bypass;
        }
        match t.allotments.spend(&k, check.hits, now) {
            Local::Admitted { left, expires, .. } => {
                let Some(key) = t.keys.get(&k[..]) else {
                    // Tokens with no answer to shape: cannot happen (a
                    // grant comes with its key); ask the node.
                    return Spend::Bypass;
                };
                let decision = Decision {
                    allowed: true,
                    limit: key.limit,
                    remaining: left,
                    retry_after: None,
                    reset_after: key.window,
                    window: key.window,
                    policy: crate::policy_name(check),
                    source: Source::Sluice { approximate: true },
                    path: Path::LocalAllotment,
                    in_process: !waited,
                };
                let mut wake = false;
                if check.hits > 0 {
                    // The key is allocated once, when it first has spending.
                    match t.pending.get_mut(&k[..]) {
                        Some(p) => *p = p.saturating_add(check.hits),
                        None => {
                            t.pending.insert(Arc::from(k), check.hits);
                        }
                    }
                    self.stats
                        .unreported_hits
                        .fetch_add(check.hits, Ordering::Relaxed);
                    // Reported by the end of the allotment it came from.
                    if t.due.is_none_or(|due| expires < due) {
                        t.due = Some(expires);
                        wake = true;
                    }
                }
                drop(t);
                // Not under the lock: a wakeup may be a syscall.
                if wake {
                    self.wake.notify_one();
                }
                self.stats.local_admitted.fetch_add(1, Ordering::Relaxed);
                Spend::Decided(decision)
            }
            Local::Refused { retry_after } => {
                Spend::Decided(self.refused(&t, &k, check, retry_after, waited))
            }
            Local::Ask {
                demand,
                unused,
                pace,
            } => {
                // Not sent after all: the paced ask it would have been ends.
                let unsent = |t: &mut Table| {
                    keep_unused(t, &k, unused);
                    if let Some(id) = pace {
                        t.allotments.ask_done(&k, id);
                    }
                };
                if let Some((left, until)) = t.cooling.get_mut(&k[..])
                    && *left > 0
                    && now < *until
                {
                    *left -= 1;
                    let retry_after = *until - now;
                    unsent(&mut t);
                    return Spend::Decided(self.refused(&t, &k, check, retry_after, waited));
                }
                if waited {
                    unsent(&mut t);
                    // Asked a moment ago: try again after about a round trip.
                    return Spend::Decided(self.refused(&t, &k, check, REFUSED_AFTER_WAIT, true));
                }
                t.cooling.remove(&k[..]);
                if let Some((_, done)) = t.asking.get(&k[..]) {
                    let done = done.clone();
                    unsent(&mut t);
                    return Spend::Wait(done);
                }
                let key: Arc<[u8]> = Arc::from(k);
                let id = t.next_ask;
                t.next_ask += 1;
                let (tx, rx) = watch::channel(Asked::Pending);
                t.asking.insert(key.clone(), (id, rx));
                Spend::Ask {
                    demand,
                    unused,
                    asking: Asking {
                        allotter: self,
                        key,
                        id,
                        done: tx,
                        pace,
                    },
                }
            }
        }
    }

    /// A refusal decided here (`waited`: after waiting for an ask), its
    /// limit from the table already locked for the decision (no second
    /// lookup on the path most checks of an exhausted key take).
    fn refused(
        &self,
        t: &Table,
        k: &[u8],
        check: &Check,
        retry_after: u64,
        waited: bool,
    ) -> Decision {
        let (limit, window) = t
            .keys
            .get(k)
            .map_or((0, Duration::from_secs(1)), |key| (key.limit, key.window));
        self.stats.local_refused.fetch_add(1, Ordering::Relaxed);
        Decision {
            allowed: false,
            limit,
            remaining: 0,
            retry_after: Some(Duration::from_nanos(retry_after)),
            reset_after: window,
            window,
            policy: crate::policy_name(check),
            source: Source::Sluice { approximate: true },
            path: Path::LocalAllotment,
            in_process: !waited,
        }
    }

    /// Ask the node: decide `check` and grant the next allotment. `Err`
    /// with the status when the call failed (the caller decides).
    /// `within`: how long the caller waits for the answer.
    pub(crate) async fn ask(
        &self,
        check: &Check,
        demand: u64,
        unused: u64,
        pace: Option<u64>,
        within: Duration,
    ) -> Result<pb::RateLimitResponse, tonic::Status> {
        self.stats.asks.fetch_add(1, Ordering::Relaxed);
        let mut request = check.to_wire();
        request.mode = pb::Mode::Tiered as i32;
        // The report goes with the ask unless another exchange has it now,
        // it is large, or the ask may take longer than a report may; the
        // lock is held until its acknowledgement is taken in (a failed or
        // cancelled ask leaves the report in flight, resent unchanged).
        let mut reporting = None;
        let mut report = None;
        if within <= REPORT_TIMEOUT
            && let Ok(one) = self.reporting.try_lock()
        {
            // Only a report cut here: one not acknowledged is the
            // reporter's to resend.
            let mut t = self.table();
            if t.in_flight.is_none() && t.pending.len() <= CARRIED_ITEMS {
                cut(&mut t, &self.id);
                report = t.in_flight.as_ref().map(|(r, _)| r.clone());
            }
            drop(t);
            if report.is_some() {
                reporting = Some(Carrying {
                    allotter: self,
                    _one: one,
                });
                self.stats.reports_sent.fetch_add(1, Ordering::Relaxed);
                self.stats.reports_carried.fetch_add(1, Ordering::Relaxed);
            }
        }
        // Counting the report's hits of this key: the node takes them off
        // when it has applied the report.
        let unreported = self.unreported(&encode(check));
        // The grant's life is counted from before the call: this process
        // stops spending before the node stops counting the tokens.
        let sent = self.now();
        let mut rpc = self.rpc.clone();
        let answer = rpc
            .allot(pb::AllotRequest {
                client_id: self.id.clone(),
                request: Some(request.clone()),
                demand,
                unused,
                unreported: Some(unreported),
                pace: pace.is_some(),
                report,
            })
            .await;
        let answer = match answer {
            Ok(a) => a.into_inner(),
            Err(status) => {
                if status.code() == tonic::Code::Unimplemented {
                    self.on.store(false, Ordering::Relaxed);
                }
                return Err(status);
            }
        };
        if let Some(ack) = &answer.report {
            self.acknowledged(ack.ack);
        }
        drop(reporting);
        let response = answer
            .response
            .ok_or_else(|| tonic::Status::internal("an Allot answer with no response"))?;
        if response.error.is_none() {
            let k = encode(check);
            // Both counted from when the ask was sent (the node counts
            // from when it arrived): this allotment ends before the
            // node's, and its pace runs at the rate the node lent, ahead
            // of it by no more than the ask's trip to the node.
            let expires = sent.saturating_add(answer.expires_in_us.saturating_mul(1_000));
            let since = sent.saturating_add(answer.paced_after_us.saturating_mul(1_000));
            let received = self.now();
            let grant = Grant {
                amount: answer.granted,
                expires,
                paced: answer.paced,
            };
            let mut t = self.table();
            request.hits = None;
            let key = Key {
                request,
                limit: u64::try_from(response.limit).unwrap_or(0),
                window: Duration::from_millis(u64::try_from(response.window_ms).unwrap_or(0)),
            };
            if t.keys.len() >= self.max_keys.saturating_mul(2) && !t.keys.contains_key(&k[..]) {
                prune(&mut t);
            }
            // Refused with nothing granted (no tokens, no pace): the next
            // few checks are refused here before asking again.
            let nothing = response.status == pb::Status::OverLimit as i32
                && grant.amount == 0
                && grant.paced == 0;
            let now = self.now();
            if nothing && t.cooling.len() >= self.max_keys {
                t.cooling.retain(|_, (_, until)| now < *until);
            }
            if nothing && t.cooling.len() < self.max_keys {
                // Sooner if the node said when to ask again (it passes
                // its allotment on again when its apps' paces end).
                let wait = match u64::try_from(response.retry_after_ms) {
                    Ok(ms) if ms > 0 => Duration::from_millis(ms).min(REFUSE_AT_MOST),
                    _ => REFUSE_AT_MOST,
                };
                let until = now.saturating_add(wait.as_nanos() as u64);
                t.cooling
                    .insert(Arc::from(&k[..]), (REFUSE_BEFORE_ASKING, until));
            }
            if t.keys.len() < self.max_keys.saturating_mul(2) || t.keys.contains_key(&k[..]) {
                t.keys.insert(Arc::from(&k[..]), key);
                t.allotments
                    .answered_since(&k, grant, pace, since, received);
                if grant.amount > 0 || grant.paced > 0 {
                    self.stats.grants.fetch_add(1, Ordering::Relaxed);
                    self.stats
                        .granted_tokens
                        .fetch_add(grant.amount.saturating_add(grant.paced), Ordering::Relaxed);
                }
            }
        }
        Ok(response)
    }

    /// Hits of `k` spent here and not yet acknowledged.
    fn unreported(&self, k: &[u8]) -> u64 {
        let t = self.table();
        let pending = t.pending.get(k).copied().unwrap_or(0);
        let reporting = t.in_flight.iter().flat_map(|(_, per_key)| per_key.iter());
        reporting
            .filter(|(key, _)| &key[..] == k)
            .fold(pending, |sum, (_, h)| sum.saturating_add(*h))
    }

    /// Report what was spent (the report in flight first, unchanged);
    /// spending not yet due only if `now` (a flush). Returns whether
    /// nothing is left unacknowledged.
    pub(crate) async fn report(&self, now: bool) -> bool {
        let _one = self.reporting.lock().await;
        let report = {
            let mut t = self.table();
            let at = self.now();
            if t.in_flight.is_none() {
                if !now && t.due.is_none_or(|due| due > at) {
                    return t.pending.is_empty();
                }
                cut(&mut t, &self.id);
            } else if !now && t.resend_at.is_some_and(|resend| resend > at) {
                return false;
            }
            match &t.in_flight {
                Some((r, _)) => r.clone(),
                None => return true,
            }
        };
        self.stats.reports_sent.fetch_add(1, Ordering::Relaxed);
        let mut rpc = self.rpc.clone();
        let ack = match tokio::time::timeout(REPORT_TIMEOUT, rpc.report(report)).await {
            Ok(Ok(r)) => r.into_inner().ack,
            _ => 0,
        };
        let done = self.acknowledged(ack);
        let mut t = self.table();
        if !done {
            t.resend_at = Some(resend_after(self.now()));
        }
        done && t.in_flight.is_none() && t.pending.is_empty()
    }

    /// The report in flight was answered `ack`: whether it is done with
    /// (applied, now or before, or never applicable), so the next can be
    /// cut.
    fn acknowledged(&self, ack: i32) -> bool {
        let done = if ack == pb::Ack::Applied as i32 {
            &self.stats.reports_applied
        } else if ack == pb::Ack::Duplicate as i32 {
            &self.stats.reports_duplicate
        } else if ack == pb::Ack::Invalid as i32 {
            &self.stats.reports_invalid
        } else {
            // Retry (or an answer this client does not know): resend.
            return false;
        };
        done.fetch_add(1, Ordering::Relaxed);
        let mut t = self.table();
        if let Some((_, per_key)) = t.in_flight.take() {
            let hits = per_key
                .iter()
                .fold(0u64, |sum, (_, h)| sum.saturating_add(*h));
            self.stats.unreported_hits.fetch_sub(
                hits.min(self.stats.unreported_hits.load(Ordering::Relaxed)),
                Ordering::Relaxed,
            );
        }
        true
    }

    /// How long until a report is due: the resend of one in flight
    /// unacknowledged, when the first waiting spending is due otherwise;
    /// None if nothing waits.
    fn report_in(&self) -> Option<Duration> {
        let now = self.now();
        let t = self.table();
        let at = if t.in_flight.is_some() {
            // No time set: an ask carrying it is out now, or a flush was
            // cancelled mid-call — look again a resend's wait from now.
            t.resend_at.unwrap_or(resend_after(now))
        } else {
            t.due?
        };
        Some(Duration::from_nanos(at.saturating_sub(now)))
    }
}

impl Drop for Allotter {
    fn drop(&mut self) {
        // The reporter may be asleep with nothing due: it ends now.
        self.wake.notify_one();
    }
}

/// When a report that was not acknowledged at `now` is sent again.
fn resend_after(now: u64) -> u64 {
    now.saturating_add(REPORT_EVERY.as_nanos() as u64)
}

/// Cut the next report from what is pending (at most [`REPORT_ITEMS`]).
fn cut(t: &mut Table, client_id: &str) {
    if t.pending.is_empty() {
        t.due = None;
        return;
    }
    let keys: Vec<Arc<[u8]>> = t.pending.keys().take(REPORT_ITEMS).cloned().collect();
    let mut spent = Vec::with_capacity(keys.len());
    let mut per_key = Vec::with_capacity(keys.len());
    for k in keys {
        // A pending key always has its request: `prune` keeps it.
        let Some(key) = t.keys.get(&k) else {
            continue;
        };
        let mut r = key.request.clone();
        let Some(hits) = t.pending.remove(&k) else {
            continue;
        };
        r.hits = Some(i64::try_from(hits).unwrap_or(i64::MAX));
        spent.push(r);
        per_key.push((k, hits));
    }
    // All of it cut: nothing waits to be due. (Keys left beyond the
    // items bound keep the due passed: the next report goes at once.)
    if t.pending.is_empty() {
        t.due = None;
    }
    let seq = t.next_seq;
    t.next_seq += 1;
    t.resend_at = None;
    t.in_flight = Some((
        pb::ReportRequest {
            client_id: client_id.to_string(),
            sequence: seq,
            spent,
        },
        per_key,
    ));
}

/// Forget what is known of keys with no allotment left and nothing to
/// report.
fn prune(t: &mut Table) {
    let Table {
        allotments,
        keys,
        pending,
        in_flight,
        ..
    } = t;
    let reporting: HashSet<&[u8]> = in_flight
        .iter()
        .flat_map(|(_, per_key)| per_key.iter())
        .map(|(k, _)| &k[..])
        .collect();
    keys.retain(|k, _| {
        allotments.contains(k) || pending.contains_key(k) || reporting.contains(&k[..])
    });
}

/// Report spending when it is due (an ask carries it sooner), resend a
/// report not acknowledged every [`REPORT_EVERY`], until the client is
/// gone. Holds the allotter only while reporting: the
/// client's last handle going ends the loop.
pub(crate) async fn report_loop(allotter: Weak<Allotter>, wake: Arc<tokio::sync::Notify>) {
    loop {
        let wait = {
            let Some(a) = allotter.upgrade() else { return };
            a.report_in()
        };
        // Woken (spending began, its due came sooner, an ask left the
        // report unacknowledged, or the client is gone): look again.
        let slept = match wait {
            None => {
                wake.notified().await;
                false
            }
            Some(wait) => tokio::select! {
                _ = tokio::time::sleep(wait) => true,
                _ = wake.notified() => false,
            },
        };
        if !slept {
            continue;
        }
        let Some(a) = allotter.upgrade() else { return };
        a.report(false).await;
    }
}
