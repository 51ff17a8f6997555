//! Responses that are ready together leave in one write.
//!
//! The HTTP/2 connection task writes and flushes whatever frames are ready
//! each time it runs. Each call's handler is a task of its own, and when
//! one finishes it wakes the connection task — which tokio's multi-thread
//! scheduler runs next (its LIFO slot), so with 64 calls in flight on one
//! connection every response left in its own `writev`: 52,486 of them in
//! 3 s against 1,463 reads (`strace -c`, 1 decision per call), the
//! kernel's send path about 40% of the server's CPU.
//!
//! [`Coalescing`] holds written bytes and, on the first flush of a round,
//! yields once instead of writing: the connection task goes to the back
//! of the run queue, the handlers already queued finish first, and the
//! next flush writes all their responses in one call. A lone response
//! waits one trip through the run queue, not a timer. The held bytes are
//! bounded by [`MAX_HELD`]; past it a write drains them first.
//!
//! Bytes still held when a connection is dropped unflushed are lost — as
//! they would be in h2's or hyper's own buffers: every such path (an I/O
//! error, a forced shutdown) ends the connection anyway, and a clean close
//! drains first (`poll_shutdown`).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Bytes held for one write at most (a connection's share of memory).
pub const MAX_HELD: usize = 64 * 1024;
/// A buffer grown past this is given back once drained: an idle
/// connection holds no write buffer of its peak size.
const KEEP_CAPACITY: usize = 8 * 1024;

/// An IO whose writes are held until a flush, and whose first flush of a
/// round yields to the tasks already queued.
pub struct Coalescing<IO> {
    io: IO,
    held: Vec<u8>,
    /// Bytes of `held` already written (a drain the socket interrupted).
    sent: usize,
    /// This round's flush has yielded once.
    yielded: bool,
}

impl<IO> Coalescing<IO> {
    pub fn new(io: IO) -> Coalescing<IO> {
        Coalescing {
            io,
            held: Vec::new(),
            sent: 0,
            yielded: false,
        }
    }

    pub fn get_ref(&self) -> &IO {
        &self.io
    }
}

impl<IO: AsyncWrite + Unpin> Coalescing<IO> {
    /// Write out every held byte (Pending when the socket is full: the
    /// rest stays held, in order).
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.held.len() {
            match Pin::new(&mut self.io).poll_write(cx, &self.held[self.sent..]) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                Poll::Ready(Ok(n)) => self.sent += n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        self.sent = 0;
        self.yielded = false;
        if self.held.capacity() > KEEP_CAPACITY {
            self.held = Vec::new();
        } else {
            self.held.clear();
        }
        Poll::Ready(Ok(()))
    }

    /// Capacity for `len` more held bytes (which fit under [`MAX_HELD`]):
    /// grown by doubling as a Vec does, but never past the bound, so a
    /// connection's buffer is at most [`MAX_HELD`] bytes.
    fn hold(&mut self, len: usize) {
        let need = self.held.len() + len;
        if need > self.held.capacity() {
            let want = need.max(self.held.capacity() * 2).min(MAX_HELD);
            self.held.reserve_exact(want - self.held.len());
        }
    }

    /// Room for `len` more bytes: drains first when they would not fit.
    fn poll_room(&mut self, cx: &mut Context<'_>, len: usize) -> Poll<io::Result<()>> {
        if !self.held.is_empty() && self.held.len() + len > MAX_HELD {
            return self.poll_drain(cx);
        }
        Poll::Ready(Ok(()))
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Coalescing<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Coalescing<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        std::task::ready!(this.poll_room(cx, buf.len()))?;
        if buf.len() >= MAX_HELD {
            // Nothing is held (the room was made): a large write goes
            // straight through.
            return Pin::new(&mut this.io).poll_write(cx, buf);
        }
        this.hold(buf.len());
        this.held.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let len = bufs.iter().map(|b| b.len()).sum::<usize>();
        std::task::ready!(this.poll_room(cx, len))?;
        if len >= MAX_HELD {
            return Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        }
        this.hold(len);
        for b in bufs {
            this.held.extend_from_slice(b);
        }
        Poll::Ready(Ok(len))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.held.is_empty() {
            return Pin::new(&mut this.io).poll_flush(cx);
        }
        if !this.yielded {
            // Woken while running, a tokio task is queued behind the tasks
            // already ready (a yield, not the LIFO slot).
            this.yielded = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        std::task::ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        std::task::ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Waker;

    /// Records each write it is given; `full`: every write is Pending.
    #[derive(Default)]
    struct Recorder {
        writes: Vec<Vec<u8>>,
        flushes: usize,
        full: bool,
        /// At most this many bytes per write (a socket taking part).
        max: Option<usize>,
    }

    impl AsyncWrite for Recorder {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            if self.full {
                return Poll::Pending;
            }
            let n = self.max.map_or(buf.len(), |m| m.min(buf.len()));
            self.writes.push(buf[..n].to_vec());
            Poll::Ready(Ok(n))
        }
        fn poll_flush(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.flushes += 1;
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    fn cx() -> Context<'static> {
        Context::from_waker(Waker::noop())
    }

    fn write(c: &mut Coalescing<Recorder>, bytes: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(c).poll_write(&mut cx(), bytes)
    }

    fn flush(c: &mut Coalescing<Recorder>) -> Poll<io::Result<()>> {
        Pin::new(c).poll_flush(&mut cx())
    }

    #[test]
    fn writes_of_one_round_leave_in_one_write_after_one_yield() {
        let mut c = Coalescing::new(Recorder::default());
        assert!(matches!(write(&mut c, b"one "), Poll::Ready(Ok(4))));
        assert!(matches!(write(&mut c, b"two "), Poll::Ready(Ok(4))));
        // The first flush yields; what is written meanwhile joins it.
        assert!(flush(&mut c).is_pending());
        assert!(c.io.writes.is_empty());
        let bufs = [io::IoSlice::new(b"thr"), io::IoSlice::new(b"ee")];
        let n = Pin::new(&mut c).poll_write_vectored(&mut cx(), &bufs);
        assert!(matches!(n, Poll::Ready(Ok(5))));
        assert!(matches!(flush(&mut c), Poll::Ready(Ok(()))));
        assert_eq!(c.io.writes, vec![b"one two three".to_vec()]);
        assert_eq!(c.io.flushes, 1);
        // The next round yields again; an empty flush passes straight on.
        assert!(matches!(write(&mut c, b"four"), Poll::Ready(Ok(4))));
        assert!(flush(&mut c).is_pending());
        assert!(matches!(flush(&mut c), Poll::Ready(Ok(()))));
        assert!(matches!(flush(&mut c), Poll::Ready(Ok(()))));
        assert_eq!(
            c.io.writes,
            vec![b"one two three".to_vec(), b"four".to_vec()]
        );
        assert_eq!(c.io.flushes, 3);
    }

    #[test]
    fn held_bytes_are_bounded_and_keep_their_order() {
        let mut c = Coalescing::new(Recorder::default());
        let chunk = vec![7u8; MAX_HELD / 2 + 1];
        assert!(write(&mut c, &chunk).is_ready());
        // The second would pass the bound: the first leaves before it.
        assert!(write(&mut c, &[8u8; MAX_HELD / 2]).is_ready());
        assert_eq!(c.io.writes, vec![chunk.clone()]);
        assert_eq!(c.held.len(), MAX_HELD / 2);
        // A write of the bound or more goes through, after what is held.
        let big = vec![9u8; MAX_HELD];
        assert!(matches!(write(&mut c, &big), Poll::Ready(Ok(n)) if n == MAX_HELD));
        assert_eq!(c.io.writes.len(), 3);
        assert_eq!(c.io.writes[1], vec![8u8; MAX_HELD / 2]);
        assert_eq!(c.io.writes[2], big);
        assert!(c.held.is_empty());
        // Held bytes up to the bound never take a buffer past it (a Vec
        // left to itself would double 40 KB to 80 KB here).
        assert!(write(&mut c, &[1u8; 40 * 1024]).is_ready());
        assert!(write(&mut c, &[2u8; 24 * 1024]).is_ready());
        assert_eq!(c.held.len(), MAX_HELD);
        assert!(c.held.capacity() <= MAX_HELD);
    }

    #[test]
    fn a_full_socket_keeps_the_rest_and_shutdown_drains_it() {
        let mut c = Coalescing::new(Recorder {
            max: Some(3),
            ..Recorder::default()
        });
        assert!(write(&mut c, b"abcdefgh").is_ready());
        assert!(flush(&mut c).is_pending());
        c.io.full = true;
        // Full after the yield: nothing lost, nothing written twice.
        assert!(flush(&mut c).is_pending());
        c.io.full = false;
        assert!(flush(&mut c).is_ready());
        assert_eq!(c.io.writes.concat(), b"abcdefgh".to_vec());
        assert!(write(&mut c, b"xyz!").is_ready());
        assert!(Pin::new(&mut c).poll_shutdown(&mut cx()).is_ready());
        assert_eq!(c.io.writes.concat(), b"abcdefghxyz!".to_vec());
    }
}
