//! Where a node's sockets come from: the operating system's, or a
//! simulated network's.
//!
//! A node opens three kinds of sockets: TCP listeners (the gRPC, peer,
//! admin and HTTP ports), TCP connections to its peers (tonic's channels)
//! and one UDP port (gossip). [`Network`] opens all three. [`Os`] is
//! production's: tokio's sockets, exactly as before this seam existed —
//! its listeners and connections are the `Os` variants of enums whose
//! other variant is a boxed stream, so production pays a predicted branch
//! per read or write and no allocation. The deterministic simulator
//! (`crates/sluice-sim`) supplies its own `Network` over a simulated
//! fabric: the same servers, channels and gossip code then run over it.
//!
//! Why a seam and not a `cfg`: the simulator must run the production code
//! path, not a copy compiled for tests.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use async_trait::async_trait;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A boxed future, as the seam's object-safe methods return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Opens a node's sockets.
pub trait Network: Send + Sync + 'static {
    /// A TCP listener on `addr` (port 0: any free port).
    fn listen(&self, addr: SocketAddr) -> BoxFuture<'_, io::Result<TcpListening>>;

    /// A UDP port on `addr`, for gossip.
    fn datagrams(&self, addr: SocketAddr) -> BoxFuture<'_, io::Result<Arc<dyn Datagrams>>>;

    /// How gRPC channels reach `host:port`: `None` is tonic's own TCP
    /// connector (the operating system's sockets).
    fn connector(&self) -> Option<Connector>;
}

/// The operating system's sockets (production).
#[derive(Clone, Copy, Debug, Default)]
pub struct Os;

impl Network for Os {
    fn listen(&self, addr: SocketAddr) -> BoxFuture<'_, io::Result<TcpListening>> {
        Box::pin(async move {
            tokio::net::TcpListener::bind(addr)
                .await
                .map(TcpListening::Os)
        })
    }

    fn datagrams(&self, addr: SocketAddr) -> BoxFuture<'_, io::Result<Arc<dyn Datagrams>>> {
        Box::pin(async move {
            let socket = std::net::UdpSocket::bind(addr)?;
            socket.set_nonblocking(true)?;
            Ok(Arc::new(OsDatagrams(socket)) as Arc<dyn Datagrams>)
        })
    }

    fn connector(&self) -> Option<Connector> {
        None
    }
}

/// A bound TCP listener.
pub enum TcpListening {
    Os(tokio::net::TcpListener),
    Other(Box<dyn Listening>),
}

impl TcpListening {
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        match self {
            TcpListening::Os(l) => l.local_addr(),
            TcpListening::Other(l) => l.local_addr(),
        }
    }

    /// The next connection.
    pub async fn accept(&self) -> io::Result<Conn> {
        match self {
            TcpListening::Os(l) => {
                let (tcp, _) = l.accept().await?;
                // Nagle and delayed ACKs would hold small answers back.
                let _ = tcp.set_nodelay(true);
                Ok(Conn::Os(tcp))
            }
            TcpListening::Other(l) => l.accept().await.map(Conn::Other),
        }
    }
}

/// A listener of another network than the operating system's.
pub trait Listening: Send + Sync + 'static {
    fn local_addr(&self) -> io::Result<SocketAddr>;
    fn accept(&self) -> BoxFuture<'_, io::Result<Box<dyn Stream>>>;
}

/// A connection of another network than the operating system's.
pub trait Stream: AsyncRead + AsyncWrite + Send + Unpin + 'static {
    fn local_addr(&self) -> io::Result<SocketAddr>;
    fn peer_addr(&self) -> io::Result<SocketAddr>;
}

/// An accepted TCP connection.
pub enum Conn {
    Os(tokio::net::TcpStream),
    Other(Box<dyn Stream>),
}

impl Conn {
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        match self {
            Conn::Os(s) => s.local_addr(),
            Conn::Other(s) => s.local_addr(),
        }
    }

    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        match self {
            Conn::Os(s) => s.peer_addr(),
            Conn::Other(s) => s.peer_addr(),
        }
    }
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        tonic::transport::server::TcpConnectInfo {
            local_addr: self.local_addr().ok(),
            remote_addr: self.peer_addr().ok(),
        }
    }
}

impl AsyncRead for Conn {
    #[inline]
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Os(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Other(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    #[inline]
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Os(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Other(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    #[inline]
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Os(s) => Pin::new(s).poll_flush(cx),
            Conn::Other(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Os(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Other(s) => Pin::new(s).poll_shutdown(cx),
        }
    }

    #[inline]
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Os(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Conn::Other(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Os(s) => s.is_write_vectored(),
            Conn::Other(s) => s.is_write_vectored(),
        }
    }
}

/// A bound UDP port. Gossip may run on a runtime of its own (see
/// [`crate::threads`]): [`Datagrams::open`] gives a handle for the runtime
/// it is called on, as often as gossip restarts (a rejoin), on the same
/// port.
pub trait Datagrams: Send + Sync + 'static {
    fn local_addr(&self) -> io::Result<SocketAddr>;
    fn open(&self) -> io::Result<Box<dyn DatagramSocket>>;
}

/// One handle to a UDP port.
#[async_trait]
pub trait DatagramSocket: Send + Sync {
    async fn send_to(&self, datagram: &[u8], to: SocketAddr) -> io::Result<usize>;
    async fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)>;
}

/// The operating system's UDP port: a std socket, registered with the
/// runtime that opens it.
struct OsDatagrams(std::net::UdpSocket);

impl Datagrams for OsDatagrams {
    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.0.local_addr()
    }

    fn open(&self) -> io::Result<Box<dyn DatagramSocket>> {
        let socket = self.0.try_clone()?;
        socket.set_nonblocking(true)?;
        Ok(Box::new(OsSocket(tokio::net::UdpSocket::from_std(socket)?)))
    }
}

struct OsSocket(tokio::net::UdpSocket);

#[async_trait]
impl DatagramSocket for OsSocket {
    async fn send_to(&self, datagram: &[u8], to: SocketAddr) -> io::Result<usize> {
        self.0.send_to(datagram, to).await
    }

    async fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        self.0.recv_from(buf).await
    }
}

/// Dials `host:port` on another network than the operating system's.
pub trait Dial: Send + Sync + 'static {
    fn dial(&self, host: &str, port: u16) -> BoxFuture<'static, io::Result<Box<dyn Stream>>>;
}

/// A tonic connector over a [`Dial`] (`Endpoint::connect_with_connector_lazy`).
#[derive(Clone)]
pub struct Connector(pub Arc<dyn Dial>);

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Connector")
    }
}

impl tower::Service<http::Uri> for Connector {
    type Response = hyper_util::rt::TokioIo<Box<dyn Stream>>;
    type Error = io::Error;
    type Future = BoxFuture<'static, io::Result<Self::Response>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let (Some(host), Some(port)) = (uri.host(), uri.port_u16()) else {
            return Box::pin(std::future::ready(Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{uri}: no host:port"),
            ))));
        };
        let dialing = self.0.dial(host, port);
        Box::pin(async move { dialing.await.map(hyper_util::rt::TokioIo::new) })
    }
}
