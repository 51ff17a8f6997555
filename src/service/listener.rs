//! The listeners' accept loops — gRPC's and the HTTP server's: a bound on
//! open connections, the TLS handshake (when configured) off the accept
//! loop, and the idle timeout.
//!
//! A connection beyond `max_connections` is closed at once and counted:
//! before HTTP/2 is spoken there is no way to send it a status, and holding
//! it open would be the unbounded queue the bound exists to prevent. Each
//! admitted connection holds a semaphore permit until it closes — which an
//! idle one does after `idle_connection_timeout` with no call in progress
//! (see [`super::idle`]), counted in `sluice_idle_connections_closed_total`.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::Connected;

use super::coalesce::Coalescing;
use super::idle::{Activity, ConnInfo, HttpConn, Idle};
use crate::metrics::Resources;
use crate::net::{Conn, TcpListening};
use crate::tls::Reloading;

/// A handshake that has not finished by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshaken connections waiting for the server to take them.
const READY_QUEUE: usize = 64;

/// A connection that holds its listener's permit while open, and ends
/// itself once idle.
pub struct Limited<IO> {
    /// Responses ready together leave in one write (see [`Coalescing`]).
    io: Coalescing<IO>,
    _permit: OwnedSemaphorePermit,
    activity: Arc<Activity>,
    idle: Idle,
    /// The idle timeout has ended it: every read is an end of stream.
    ended: bool,
    name: &'static str,
    resources: Arc<Resources>,
}

impl<IO: Connected> Connected for Limited<IO> {
    type ConnectInfo = ConnInfo<IO::ConnectInfo>;

    fn connect_info(&self) -> Self::ConnectInfo {
        ConnInfo {
            transport: self.io.get_ref().connect_info(),
            activity: self.activity.clone(),
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Limited<IO> {
    /// Reads; when nothing arrives, the idle timer is polled too (so it
    /// wakes the connection), and once it has expired the read is an end of
    /// stream: the server closes the connection, and the permit is freed.
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.ended {
            return Poll::Ready(Ok(()));
        }
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Pending if this.idle.expired(cx) => {
                this.ended = true;
                this.resources.idle_closed(this.name);
                tracing::debug!(listener = this.name, "idle connection closed");
                Poll::Ready(Ok(()))
            }
            read => read,
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Limited<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// A socket that accepts connections: TCP, or a Unix socket (the
/// node-local path: apps on the same host skip the TCP stack).
pub trait Accept: Send + 'static {
    type Stream: Send + 'static;
    fn accept_one(&self) -> impl std::future::Future<Output = io::Result<Self::Stream>> + Send;
}

impl Accept for TcpListening {
    type Stream = Conn;
    async fn accept_one(&self) -> io::Result<Conn> {
        self.accept().await
    }
}

impl Accept for tokio::net::UnixListener {
    type Stream = tokio::net::UnixStream;
    async fn accept_one(&self) -> io::Result<tokio::net::UnixStream> {
        self.accept().await.map(|(s, _)| s)
    }
}

/// One listener's settings.
pub struct Listener<L = TcpListening> {
    /// `grpc`, `grpc_uds`, `peer`, `admin` or `http`: the metrics label.
    pub name: &'static str,
    pub listener: L,
    pub max_connections: usize,
    /// A connection with no call in progress this long is closed.
    pub idle_timeout: Duration,
    pub resources: Arc<Resources>,
}

type Incoming<IO> = ReceiverStream<io::Result<Limited<IO>>>;

impl<L: Accept> Listener<L> {
    /// Plain connections (no TLS).
    pub fn plain(self, token: CancellationToken) -> Incoming<L::Stream> {
        self.accept(token, |s| async move { Ok(s) })
    }

    fn accept<IO, F, Fut>(self, token: CancellationToken, handshake: F) -> Incoming<IO>
    where
        IO: Send + 'static,
        F: Fn(L::Stream) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = io::Result<IO>> + Send + 'static,
    {
        let (tx, rx) = mpsc::channel(READY_QUEUE);
        let permits = Arc::new(Semaphore::new(self.max_connections.max(1)));
        let Listener {
            name,
            listener,
            max_connections,
            idle_timeout,
            resources,
        } = self;
        resources.listener(name, permits.clone(), max_connections.max(1));
        tokio::spawn(async move {
            loop {
                let stream = tokio::select! {
                    _ = token.cancelled() => return,
                    accepted = listener.accept_one() => match accepted {
                        Ok(stream) => stream,
                        Err(e) => {
                            // Out of descriptors, say: back off rather than spin.
                            tracing::warn!(listener = name, error = %e, "accept failed");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    },
                };
                let Ok(permit) = permits.clone().try_acquire_owned() else {
                    resources.exhausted("connections");
                    drop(stream);
                    continue;
                };
                let (tx, handshake) = (tx.clone(), handshake(stream));
                let resources = resources.clone();
                tokio::spawn(async move {
                    if let Ok(io) = handshake.await {
                        // Idle from the end of the handshake (which has
                        // its own timeout).
                        let activity = Activity::new();
                        let conn = Limited {
                            io: Coalescing::new(io),
                            _permit: permit,
                            idle: Idle::new(activity.clone(), idle_timeout),
                            activity,
                            ended: false,
                            name,
                            resources,
                        };
                        let _ = tx.send(Ok(conn)).await;
                    }
                });
            }
        });
        ReceiverStream::new(rx)
    }
}

impl Listener {
    /// TLS connections, handshaken with the config current at accept time.
    pub fn tls(
        self,
        tls: Arc<Reloading>,
        token: CancellationToken,
    ) -> Incoming<tokio_rustls::server::TlsStream<Conn>> {
        let name = self.name;
        self.accept(token, move |tcp| {
            let acceptor = tokio_rustls::TlsAcceptor::from(tls.current());
            async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => Ok(stream),
                    Ok(Err(e)) => {
                        tracing::debug!(listener = name, error = %e, "TLS handshake failed");
                        Err(e)
                    }
                    Err(_) => Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "TLS handshake timed out",
                    )),
                }
            }
        })
    }
}

/// The HTTP server's listener: the same bound and idle timeout as gRPC's,
/// for axum (`/metrics`, health, and the HTTP check are reachable by
/// anyone who reaches the port, so an idle or a flood of connections must
/// not hold it).
pub struct HttpListener {
    incoming: Incoming<Conn>,
    local: std::net::SocketAddr,
}

impl HttpListener {
    pub fn new(listener: Listener, token: CancellationToken) -> io::Result<HttpListener> {
        let local = listener.listener.local_addr()?;
        Ok(HttpListener {
            incoming: listener.plain(token),
            local,
        })
    }
}

impl axum::serve::Listener for HttpListener {
    type Io = Limited<Conn>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.incoming.next().await {
                Some(Ok(conn)) => match conn.io.get_ref().peer_addr() {
                    Ok(addr) => return (conn, addr),
                    // Gone before it was served.
                    Err(_) => continue,
                },
                Some(Err(_)) => continue,
                // Shut down: the server stops by its own graceful shutdown.
                None => std::future::pending::<()>().await,
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local)
    }
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, HttpListener>>
    for HttpConn
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, HttpListener>) -> HttpConn {
        HttpConn {
            remote: *stream.remote_addr(),
            activity: stream.io().activity.clone(),
        }
    }
}
