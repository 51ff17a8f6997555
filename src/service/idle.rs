//! Idle gRPC connections: closed after `limits.idle_connection_timeout`
//! with no call in progress, so a client that connects and goes quiet — or
//! never starts a call — does not hold its place in `max_connections`
//! forever.
//!
//! Idle means no call, not no bytes. The server's HTTP/2 keepalive pings
//! (and their acks) are bytes on every live connection, idle or not: by
//! bytes, a quiet client that answers pings would never be idle, and a
//! client trickling a byte now and then to a call it never completes would
//! never be either. So each accepted connection carries an [`Activity`]:
//! [`CountCalls`], a layer around every gRPC service, counts the calls in
//! progress on it (from request to the end of the response body, so a
//! stream counts for as long as it is open), and the connection's reads
//! ([`Idle::expired`], polled by the listener's stream wrapper) end it once
//! it has had none for the whole timeout. The pings are what close a dead
//! peer's connection while a call is in progress (no ack in time).
//!
//! Closing is an end of stream on the server's reads: hyper then closes the
//! connection (there is no way to send GOAWAY from here). A client's
//! channel reconnects on its next call; one sent at the very moment of the
//! close fails as any call on a dropped connection does.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo, UdsConnectInfo};

/// At most this long between keepalive pings, and at most this long for
/// each ping's ack (hyper's own default), however long the idle timeout.
const PING_EVERY_AT_MOST: Duration = Duration::from_secs(60);
const PING_ACK_AT_MOST: Duration = Duration::from_secs(20);
/// At least this long for an ack: a short idle timeout must not turn a
/// pause of the peer (a GC, a busy core) into a dropped connection with
/// calls in progress — failed forwards, open breakers.
const PING_ACK_AT_LEAST: Duration = Duration::from_secs(1);

/// The HTTP/2 keepalive `(interval, timeout)` for an idle timeout: a ping
/// every quarter of it (at most a minute), each answered within the
/// interval (at least 1 s, at most 20 s) — so a dead peer's connection with a call in
/// progress is closed in well under the idle timeout.
pub fn keepalive(idle_timeout: Duration) -> (Duration, Duration) {
    let every = (idle_timeout / 4).min(PING_EVERY_AT_MOST);
    (every, every.clamp(PING_ACK_AT_LEAST, PING_ACK_AT_MOST))
}

/// Calls in progress on one connection, and since when it has had none.
#[derive(Debug)]
pub struct Activity {
    calls: AtomicUsize,
    /// Nanoseconds from `opened` to the end of the last call (0: none yet).
    last_call_end: AtomicU64,
    opened: Instant,
}

impl Activity {
    pub fn new() -> Arc<Activity> {
        Arc::new(Activity {
            calls: AtomicUsize::new(0),
            last_call_end: AtomicU64::new(0),
            opened: Instant::now(),
        })
    }

    /// A call starts: in progress until the returned guard is dropped.
    pub fn call(self: &Arc<Self>) -> Call {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Call(self.clone())
    }

    /// Calls in progress now.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// How long the connection has had no call in progress (None: one is).
    fn idle_for(&self) -> Option<Duration> {
        if self.calls() > 0 {
            return None;
        }
        let since = Duration::from_nanos(self.last_call_end.load(Ordering::SeqCst));
        Some(self.opened.elapsed().saturating_sub(since))
    }
}

/// One call in progress on a connection (see [`Activity::call`]).
#[derive(Debug)]
pub struct Call(Arc<Activity>);

impl Drop for Call {
    fn drop(&mut self) {
        let a = &self.0;
        // The end first, then the count: whoever sees no call sees its end.
        let now = u64::try_from(a.opened.elapsed().as_nanos()).unwrap_or(u64::MAX);
        a.last_call_end.fetch_max(now, Ordering::SeqCst);
        a.calls.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What the gRPC services learn of a connection (tonic puts it in every
/// request's extensions): the transport's own info, and the connection's
/// [`Activity`], on which [`CountCalls`] counts the calls.
#[derive(Clone, Debug)]
pub struct ConnInfo<I> {
    pub transport: I,
    pub activity: Arc<Activity>,
}

/// What the HTTP server learns of a connection (axum's `ConnectInfo`):
/// the caller's address, and the connection's [`Activity`].
#[derive(Clone, Debug)]
pub struct HttpConn {
    pub remote: std::net::SocketAddr,
    pub activity: Arc<Activity>,
}

/// A request's call begins on its connection (over plain TCP or TLS), and
/// the transport's own info is put back where tonic's `remote_addr()` and
/// `peer_certs()` look for it (as tonic inserts it for its own streams).
fn begin(extensions: &mut http::Extensions) -> Option<Call> {
    if let Some(c) = extensions.get::<axum::extract::ConnectInfo<HttpConn>>() {
        return Some(c.0.activity.call());
    }
    if let Some(c) = extensions.get::<ConnInfo<TcpConnectInfo>>().cloned() {
        extensions.insert(c.transport);
        return Some(c.activity.call());
    }
    if let Some(c) = extensions.get::<ConnInfo<UdsConnectInfo>>().cloned() {
        extensions.insert(c.transport);
        return Some(c.activity.call());
    }
    let c = extensions
        .get::<ConnInfo<TlsConnectInfo<TcpConnectInfo>>>()
        .cloned()?;
    extensions.insert(c.transport.get_ref().clone());
    extensions.insert(c.transport);
    Some(c.activity.call())
}

/// The timer of one connection's idle timeout.
pub struct Idle {
    activity: Arc<Activity>,
    timeout: Duration,
    timer: Pin<Box<Sleep>>,
}

impl Idle {
    pub fn new(activity: Arc<Activity>, timeout: Duration) -> Idle {
        Idle {
            activity,
            timeout,
            timer: Box::pin(tokio::time::sleep(timeout)),
        }
    }

    /// Whether the connection has had no call in progress for the whole
    /// timeout. Otherwise the timer is armed for the earliest moment it
    /// could have (and wakes `cx` then).
    pub fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        loop {
            if self.timer.as_mut().poll(cx).is_pending() {
                return false;
            }
            let wait = match self.activity.idle_for() {
                Some(idle) if idle >= self.timeout => return true,
                Some(idle) => self.timeout - idle,
                // A call in progress: look again a whole timeout later
                // (its end moves the deadline no earlier than that).
                None => self.timeout,
            };
            self.timer.as_mut().reset(Instant::now() + wait);
        }
    }
}

/// Counts each request as a call in progress on its connection until its
/// response body ends (see the module doc). Put it outermost.
#[derive(Clone, Copy, Debug, Default)]
pub struct CountCallsLayer;

impl<S> tower::Layer<S> for CountCallsLayer {
    type Service = CountCalls<S>;

    fn layer(&self, inner: S) -> CountCalls<S> {
        CountCalls(inner)
    }
}

#[derive(Clone, Debug)]
pub struct CountCalls<S>(S);

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for CountCalls<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Counted<ResBody>>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<ReqBody>) -> Self::Future {
        let call = begin(request.extensions_mut());
        let response = self.0.call(request);
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|body| Counted { body, _call: call }))
        })
    }
}

/// A response body that keeps its call in progress until it is dropped
/// (sent to its end, or the stream reset).
#[derive(Debug)]
pub struct Counted<B> {
    body: B,
    _call: Option<Call>,
}

impl<B: Body + Unpin> Body for Counted<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keepalive_pings_within_the_idle_timeout() {
        let s = Duration::from_secs;
        assert_eq!(keepalive(s(300)), (s(60), s(20)));
        assert_eq!(keepalive(s(60)), (s(15), s(15)));
        let ms = Duration::from_millis;
        assert_eq!(
            keepalive(ms(200)),
            (ms(50), s(1)),
            "an ack gets 1 s at least"
        );
    }

    /// A request's call is counted from its start to the end of its
    /// response body, and the handler still finds the transport's info.
    #[tokio::test]
    async fn a_call_lasts_until_its_response_body_ends() {
        use tower::{Layer, Service, ServiceExt};
        let activity = Activity::new();
        let remote = "127.0.0.1:4000".parse().ok();
        let seen = activity.clone();
        let mut service = CountCallsLayer.layer(tower::service_fn(move |r: http::Request<()>| {
            let calls = seen.calls();
            let addr = r
                .extensions()
                .get::<TcpConnectInfo>()
                .map(|i| i.remote_addr);
            async move {
                assert_eq!(calls, 1, "in progress in the handler");
                assert_eq!(addr, Some(remote), "the transport's info is there");
                Ok::<_, std::convert::Infallible>(http::Response::new(String::from("body")))
            }
        }));
        let mut request = http::Request::new(());
        request.extensions_mut().insert(ConnInfo {
            transport: TcpConnectInfo {
                local_addr: None,
                remote_addr: remote,
            },
            activity: activity.clone(),
        });
        let response = service.ready().await.unwrap().call(request).await.unwrap();
        assert_eq!(activity.calls(), 1, "the body is not sent yet");
        drop(response);
        assert_eq!(activity.calls(), 0);
    }

    #[tokio::test]
    async fn idle_only_with_no_call_in_progress() {
        let activity = Activity::new();
        let (first, second) = (activity.call(), activity.call());
        assert_eq!(activity.calls(), 2);
        assert_eq!(activity.idle_for(), None);
        drop(first);
        assert_eq!(activity.idle_for(), None, "one call is still in progress");
        drop(second);
        assert_eq!(activity.calls(), 0);
        // Idle since the last call ended, not since the connection opened.
        let idle = activity.idle_for().unwrap();
        assert!(idle < activity.opened.elapsed(), "{idle:?}");
    }
}
