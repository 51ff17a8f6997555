//! The node's bound on gRPC message bytes being received: checked as a
//! message's bytes arrive, before tonic buffers and decodes them.
//!
//! Admission (`admission.rs`) bounds the calls being decided, but a call
//! reaches it only once tonic has read and decoded its whole message — up
//! to `max_message_bytes` (4 MiB) each, on up to `max_concurrent_streams`
//! streams of each of `max_connections` connections: terabytes a client
//! can make the node hold before any bound applies. So every request body
//! passes through [`Budgeted`], which reads each gRPC message's 5-byte
//! prefix (a flag and the message's length) as it goes by and takes the
//! message's bytes from one node-wide semaphore of
//! `limits.max_inbound_bytes` as they arrive, before they are handed on to
//! tonic's buffer. Bytes are charged as they come, not as announced: a
//! client that announces 4 MiB messages and sends nothing holds nothing
//! (announcing is free; only bytes sent take memory). A message longer
//! than the whole budget is refused at its prefix. A chunk that does not
//! fit ends its call with `RESOURCE_EXHAUSTED` at once (counted as
//! `inbound_bytes` in `sluice_resource_exhausted_total`), as every other
//! inbound bound does; waiting instead would let half-sent messages hold
//! the budget against each other. The bytes are held until the message's
//! body is dropped (tonic has decoded it; a unary call's handler then
//! meets admission at once) — for a stream, until the message after next
//! begins. Every HTTP/2 request body is counted, whatever its
//! content-type (tonic decodes a body it is handed without looking);
//! only HTTP/1.1 bodies (the status page on the admin listener) are not.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use tonic::codegen::Bytes;

use crate::metrics::Resources;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The budget, shared by every gRPC listener of a node; a tower layer.
#[derive(Clone)]
pub struct Inbound {
    permits: Arc<Semaphore>,
    max: usize,
    resources: Arc<Resources>,
}

impl Inbound {
    pub fn new(max_bytes: usize, resources: Arc<Resources>) -> Inbound {
        let max = max_bytes.min(Semaphore::MAX_PERMITS);
        let permits = Arc::new(Semaphore::new(max));
        resources.inbound(permits.clone(), max);
        Inbound {
            permits,
            max,
            resources,
        }
    }

    /// Bytes of messages being received now.
    pub fn held(&self) -> usize {
        self.max - self.permits.available_permits()
    }

    /// `body`, its messages' bytes taken from this budget as they arrive.
    pub fn budget<B>(&self, body: B) -> Budgeted<B> {
        Budgeted {
            inner: body,
            budget: self.clone(),
            prefix: [0; 5],
            prefix_len: 0,
            left: 0,
            len: 0,
            current: None,
            previous: None,
        }
    }
}

impl<S> tower::Layer<S> for Inbound {
    type Service = Budget<S>;

    fn layer(&self, inner: S) -> Budget<S> {
        Budget {
            inner,
            inbound: self.clone(),
        }
    }
}

/// A service whose requests' bodies are [`Budgeted`].
#[derive(Clone)]
pub struct Budget<S> {
    inner: S,
    inbound: Inbound,
}

impl<S, B> tower::Service<http::Request<B>> for Budget<S>
where
    S: tower::Service<http::Request<tonic::body::Body>>,
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> S::Future {
        // Every HTTP/2 body: tonic decodes whatever it is handed on a gRPC
        // route, content-type or not. The status page (HTTP/1.1 on the
        // admin listener) has no gRPC messages.
        let grpc = request.version() >= http::Version::HTTP_2;
        let inbound = self.inbound.clone();
        self.inner.call(request.map(|b| {
            if grpc {
                tonic::body::Body::new(inbound.budget(b))
            } else {
                tonic::body::Body::new(b)
            }
        }))
    }
}

/// A request body whose gRPC messages take their bytes from the node's
/// budget as their prefixes go by (see the module doc).
pub struct Budgeted<B> {
    inner: B,
    budget: Inbound,
    /// The message prefix being read (it may span frames).
    prefix: [u8; 5],
    prefix_len: usize,
    /// Bytes of the current message still to come.
    left: usize,
    /// The current message's announced length.
    len: u32,
    /// The bytes of the current message received so far, and of the one
    /// before it (tonic may still be decoding it).
    current: Option<OwnedSemaphorePermit>,
    previous: Option<OwnedSemaphorePermit>,
}

impl<B> Budgeted<B> {
    /// Account for `data`: each byte of a message takes its place in the
    /// budget as it arrives, or fails the call.
    fn take(&mut self, mut data: &[u8]) -> Result<(), tonic::Status> {
        while !data.is_empty() {
            if self.left > 0 {
                let n = self.left.min(data.len());
                self.charge(n)?;
                self.left -= n;
                data = &data[n..];
                continue;
            }
            let n = (5 - self.prefix_len).min(data.len());
            self.prefix[self.prefix_len..self.prefix_len + n].copy_from_slice(&data[..n]);
            self.prefix_len += n;
            data = &data[n..];
            if self.prefix_len < 5 {
                break;
            }
            self.prefix_len = 0;
            self.len = u32::from_be_bytes([
                self.prefix[1],
                self.prefix[2],
                self.prefix[3],
                self.prefix[4],
            ]);
            if self.len as usize > self.budget.max {
                return Err(self.refuse(self.len as usize));
            }
            self.left = self.len as usize;
            // A new message: the one before it is tonic's now; the one
            // before that is decoded and gone.
            self.previous = self.current.take();
        }
        Ok(())
    }

    /// Take `n` more bytes of the current message from the budget.
    fn charge(&mut self, n: usize) -> Result<(), tonic::Status> {
        let permits = u32::try_from(n).unwrap_or(u32::MAX);
        match self.budget.permits.clone().try_acquire_many_owned(permits) {
            Ok(p) => {
                match &mut self.current {
                    Some(c) => c.merge(p),
                    None => self.current = Some(p),
                }
                Ok(())
            }
            Err(_) => Err(self.refuse(n)),
        }
    }

    fn refuse(&self, n: usize) -> tonic::Status {
        let b = &self.budget;
        b.resources.exhausted("inbound_bytes");
        tonic::Status::resource_exhausted(format!(
            "the node is receiving {} of its {} bytes of messages (limits.max_inbound_bytes); {n} more bytes of this {}-byte message do not fit now",
            b.held(),
            b.max,
            self.len
        ))
    }
}

impl<B> Body for Budgeted<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref()
                    && let Err(status) = this.take(data)
                {
                    return Poll::Ready(Some(Err(Box::new(status))));
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            other => other.map(|_| None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use http_body_util::BodyExt;

    /// A gRPC message of `len` bytes, framed.
    fn message(len: usize) -> Vec<u8> {
        let mut m = vec![0u8];
        m.extend_from_slice(&(len as u32).to_be_bytes());
        m.extend(std::iter::repeat_n(7u8, len));
        m
    }

    /// A body that yields `chunks`, then waits forever (a client that
    /// has not finished sending).
    fn body(chunks: Vec<Vec<u8>>) -> impl Body<Data = Bytes, Error = std::io::Error> + Unpin {
        let frames = chunks
            .into_iter()
            .map(|c| Ok::<_, std::io::Error>(Frame::data(Bytes::from(c))));
        http_body_util::StreamBody::new(
            futures::stream::iter(frames).chain(futures::stream::pending()),
        )
    }

    fn inbound(max: usize) -> Inbound {
        Inbound::new(max, Arc::new(Resources::default()))
    }

    async fn read(
        b: &mut (impl Body<Data = Bytes, Error = BoxError> + Unpin),
        frames: usize,
    ) -> Result<usize, String> {
        let mut n = 0;
        for _ in 0..frames {
            match b.frame().await {
                Some(Ok(f)) => n += f.data_ref().map_or(0, |d| d.len()),
                Some(Err(e)) => return Err(e.to_string()),
                None => break,
            }
        }
        Ok(n)
    }

    #[tokio::test]
    async fn a_message_takes_its_bytes_as_they_arrive_even_split_across_frames() {
        let budget = inbound(1_000);
        let m = message(300);
        // The prefix itself split in two frames.
        let chunks = vec![m[..3].to_vec(), m[3..100].to_vec(), m[100..].to_vec()];
        let mut b = budget.budget(body(chunks));
        assert_eq!(read(&mut b, 1).await, Ok(3));
        assert_eq!(budget.held(), 0, "not until bytes of the message come");
        assert_eq!(read(&mut b, 1).await, Ok(97));
        assert_eq!(budget.held(), 95, "what arrived, not what was announced");
        assert_eq!(read(&mut b, 1).await, Ok(205));
        assert_eq!(budget.held(), 300);
        drop(b);
        assert_eq!(budget.held(), 0, "given back with the body");
    }

    #[tokio::test]
    async fn a_message_that_does_not_fit_ends_its_call_until_room_is_made() {
        let budget = inbound(1_000);
        // Announcing is free: a client that sends only prefixes holds
        // nothing, however much it announces.
        let mut announced = budget.budget(body(vec![message(999)[..5].to_vec()]));
        assert_eq!(read(&mut announced, 1).await, Ok(5));
        assert_eq!(budget.held(), 0);
        let mut first = budget.budget(body(vec![message(700)[..655].to_vec()]));
        assert_eq!(read(&mut first, 1).await, Ok(655), "a half-sent message");
        assert_eq!(budget.held(), 650, "holds what it sent");
        let mut second = budget.budget(body(vec![message(400)]));
        let refused = read(&mut second, 1).await.unwrap_err();
        assert!(refused.contains("limits.max_inbound_bytes"), "{refused}");
        assert_eq!(budget.held(), 650, "the refused one holds nothing");
        drop(first);
        let mut third = budget.budget(body(vec![message(400)]));
        assert_eq!(read(&mut third, 1).await, Ok(405));
        // Larger than the whole budget: refused at its prefix.
        let mut huge = budget.budget(body(vec![message(2_000)[..5].to_vec()]));
        assert!(read(&mut huge, 1).await.is_err());
    }

    #[tokio::test]
    async fn a_stream_holds_no_more_than_its_last_two_messages() {
        let budget = inbound(1_000);
        let mut frames: Vec<u8> = Vec::new();
        for _ in 0..5 {
            frames.extend(message(100));
        }
        let mut b = budget.budget(body(vec![frames]));
        assert_eq!(read(&mut b, 1).await, Ok(525));
        assert_eq!(budget.held(), 200);
    }
}
