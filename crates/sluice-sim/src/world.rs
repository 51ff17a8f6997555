//! A simulated host's world, through Sluice's seams: its clocks
//! ([`sluice::clock::Ticks`]) and its sockets ([`sluice::net::Network`]).
//!
//! Every host runs on a tokio runtime whose clock is paused and advanced
//! by the simulator, one tick at a time (`sim.rs`). A host's boot clock is
//! that runtime's time since it started plus where its boot clock stood
//! then; its wall clock is the boot clock plus an offset the faults move
//! (skew, NTP steps). A paused host's runtime is not advanced; when it
//! resumes, its clock jumps by the pause, as a process stopped by SIGSTOP
//! finds it.
//!
//! Sockets are `turmoil-net`'s: a per-host kernel (TCP with handshakes,
//! retransmission and resets; UDP), whose packets the simulator carries
//! between hosts. A socket call goes to the kernel of the host whose
//! runtime is being ticked (`turmoil_net::set_current`).

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use sluice::net::{
    BoxFuture, Connector, DatagramSocket, Datagrams, Dial, Listening, Network, Stream, TcpListening,
};
use turmoil_net::shim::tokio::net::{TcpListener, TcpStream, UdpSocket};

/// 2026-01-01T00:00:00Z, the simulated wall clock at the start of a run.
pub const EPOCH: i64 = 1_767_225_600_000_000_000;

/// A host's clocks, shared by its runtime (which reads them) and the
/// simulator (which moves the wall clock).
#[derive(Debug, Default)]
pub struct HostClock {
    /// The boot clock when the current runtime started (ns).
    boot_base: AtomicU64,
    /// The runtime's own clock then.
    start: Mutex<Option<tokio::time::Instant>>,
    /// The boot clock at simulated time 0 (hosts booted at different
    /// times).
    boot_zero: u64,
    /// Skew and steps of the wall clock (ns).
    wall_offset: AtomicI64,
    /// Time the machine slept (ns): the boot and wall clocks counted it,
    /// the runtime's (monotonic) clock did not.
    slept: AtomicU64,
}

impl HostClock {
    pub fn new(boot_zero: u64, wall_offset: i64) -> Arc<HostClock> {
        Arc::new(HostClock {
            boot_zero,
            wall_offset: AtomicI64::new(wall_offset),
            ..HostClock::default()
        })
    }

    /// The boot clock at simulated time `now` (ns): the host's clock runs
    /// with the simulation's whatever it did (slept included).
    pub fn boot_at(&self, now: u64) -> u64 {
        self.boot_zero + now
    }

    /// A runtime starts (a process starts) on this host, its boot clock
    /// reading `boot`. Call inside the runtime.
    pub fn started(&self, boot: u64) {
        self.boot_base
            .store(boot - self.slept.load(Ordering::SeqCst), Ordering::SeqCst);
        *self.start.lock().unwrap_or_else(|p| p.into_inner()) = Some(tokio::time::Instant::now());
    }

    /// Step the wall clock by `by` ns (an NTP step, a VM restore).
    pub fn step(&self, by: i64) {
        self.wall_offset.fetch_add(by, Ordering::SeqCst);
    }

    /// The machine slept `ns`: its boot and wall clocks jump, its
    /// monotonic clock does not.
    pub fn slept(&self, ns: u64) {
        self.slept.fetch_add(ns, Ordering::SeqCst);
    }

    fn boot(&self) -> u64 {
        let start = *self.start.lock().unwrap_or_else(|p| p.into_inner());
        let ran = start.map_or(0, |s| {
            tokio::time::Instant::now()
                .saturating_duration_since(s)
                .as_nanos() as u64
        });
        self.boot_base.load(Ordering::SeqCst) + ran + self.slept.load(Ordering::SeqCst)
    }
}

/// [`HostClock`] as Sluice reads raw clocks.
#[derive(Clone, Debug)]
pub struct SimTicks(pub Arc<HostClock>);

impl sluice::clock::Ticks for SimTicks {
    fn boot(&self) -> u64 {
        self.0.boot()
    }

    fn wall(&self) -> i64 {
        EPOCH
            + (self.0.boot() - self.0.boot_zero) as i64
            + self.0.wall_offset.load(Ordering::SeqCst)
    }
}

/// The simulated network, as a node opens sockets on it.
#[derive(Clone, Copy, Debug, Default)]
pub struct SimNet;

impl Network for SimNet {
    fn listen(&self, addr: SocketAddr) -> BoxFuture<'_, io::Result<TcpListening>> {
        Box::pin(async move {
            let l = TcpListener::bind(addr).await?;
            Ok(TcpListening::Other(Box::new(SimListener(l))))
        })
    }

    fn datagrams(&self, addr: SocketAddr) -> BoxFuture<'_, io::Result<Arc<dyn Datagrams>>> {
        Box::pin(async move {
            let s = UdpSocket::bind(addr).await?;
            Ok(Arc::new(SimDatagrams(Arc::new(s))) as Arc<dyn Datagrams>)
        })
    }

    fn connector(&self) -> Option<Connector> {
        Some(Connector(Arc::new(SimDial)))
    }
}

struct SimListener(TcpListener);

impl Listening for SimListener {
    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.0.local_addr()
    }

    fn accept(&self) -> BoxFuture<'_, io::Result<Box<dyn Stream>>> {
        Box::pin(async move {
            let (s, _) = self.0.accept().await?;
            Ok(Box::new(SimStream(s)) as Box<dyn Stream>)
        })
    }
}

/// A simulated TCP connection.
pub struct SimStream(pub TcpStream);

impl Stream for SimStream {
    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.0.local_addr()
    }

    fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.0.peer_addr()
    }
}

impl tokio::io::AsyncRead for SimStream {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for SimStream {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        std::pin::Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

struct SimDatagrams(Arc<UdpSocket>);

impl Datagrams for SimDatagrams {
    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.0.local_addr()
    }

    fn open(&self) -> io::Result<Box<dyn DatagramSocket>> {
        Ok(Box::new(SimDatagramSocket(self.0.clone())))
    }
}

struct SimDatagramSocket(Arc<UdpSocket>);

#[tonic::async_trait]
impl DatagramSocket for SimDatagramSocket {
    async fn send_to(&self, datagram: &[u8], to: SocketAddr) -> io::Result<usize> {
        self.0.send_to(datagram, to).await
    }

    async fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        self.0.recv_from(buf).await
    }
}

/// Dials a simulated host by its IP literal.
pub struct SimDial;

impl Dial for SimDial {
    fn dial(&self, host: &str, port: u16) -> BoxFuture<'static, io::Result<Box<dyn Stream>>> {
        let ip = host.trim_matches(['[', ']']).parse::<IpAddr>();
        Box::pin(async move {
            let ip = ip.map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
            let s = TcpStream::connect(SocketAddr::new(ip, port)).await?;
            Ok(Box::new(SimStream(s)) as Box<dyn Stream>)
        })
    }
}
