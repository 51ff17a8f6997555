//! Over HTTP/1.x the admin listener serves the status page and nothing
//! else.
//!
//! The admin listener accepts HTTP/1.1 so a browser can open the status
//! page; without this layer, the gRPC services beside it (admin, health)
//! would answer HTTP/1.1 requests too. They check their own credentials,
//! but only a Bearer or peer token, never the Basic credentials a browser
//! caches for the page — keeping the two apart by transport as well means
//! a page a browser opens can never drive `ResetKey`.

use futures::future::{Either, Ready, ready};

/// Wraps a listener's services: an HTTP/1.x request other than `GET` or
/// `HEAD` of `/` or `/status` gets 404 (HTTP/2 passes untouched: one
/// version compare).
#[derive(Clone, Copy, Debug, Default)]
pub struct PageOnlyOverHttp1Layer;

impl<S> tower::Layer<S> for PageOnlyOverHttp1Layer {
    type Service = PageOnlyOverHttp1<S>;

    fn layer(&self, inner: S) -> Self::Service {
        PageOnlyOverHttp1 { inner }
    }
}

#[derive(Clone, Debug)]
pub struct PageOnlyOverHttp1<S> {
    inner: S,
}

type Response = http::Response<tonic::body::Body>;

impl<S, B> tower::Service<http::Request<B>> for PageOnlyOverHttp1<S>
where
    S: tower::Service<http::Request<B>, Response = Response>,
{
    type Response = Response;
    type Error = S::Error;
    type Future = Either<S::Future, Ready<Result<Response, S::Error>>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.version() < http::Version::HTTP_2 && !is_page(&req) {
            let mut not_found = Response::new(tonic::body::Body::empty());
            *not_found.status_mut() = http::StatusCode::NOT_FOUND;
            return Either::Right(ready(Ok(not_found)));
        }
        Either::Left(self.inner.call(req))
    }
}

fn is_page<B>(req: &http::Request<B>) -> bool {
    matches!(*req.method(), http::Method::GET | http::Method::HEAD)
        && matches!(req.uri().path(), "/" | "/status")
}
