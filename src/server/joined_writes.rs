//! Accepted connections, with the writes h2 makes for one flush joined into one system call.
//!
//! h2 copies a DATA frame's payload into its write buffer when the payload is small, and chains
//! a larger one to write it in place; a chained frame is written, and the socket flushed, before
//! the next frame can be buffered. "Small" is under 256 bytes on a socket that reports vectored
//! writes, as a `TcpStream` does, and under 1 KiB on one that does not. So a unary response whose
//! message is 256 bytes or more, as most tool results are, took two `writev`s: HEADERS with DATA,
//! then the trailers. Each is the whole TCP send path (on loopback the receive path as well) and
//! one more wake-up of the caller. A plain tonic server made 1.9 writes per call for the bench's
//! 256-byte echo, and toolgate's as many.
//!
//! [`JoinedWrites`] reports no vectored writes, so h2 copies payloads under 1 KiB and such a
//! response leaves in one write, shared with any other responses ready at the same flush. A larger
//! payload is still chained, and h2, writing without vectors, then hands over the buffer and the
//! payload in two calls: this type holds writes while they fit in [`HOLD`] bytes and sends what it
//! holds together with the next write that does not fit (one `writev`) or at the flush. So no
//! response takes more system calls than it did on the bare socket. Nothing stays held past a
//! flush, and h2 flushes at the end of every batch it writes.

use std::{
    io::{self, IoSlice},
    pin::Pin,
    task::{Context, Poll, ready},
};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_stream::{Stream, StreamExt};
use tonic::transport::server::Connected;

/// Writes are held while everything held fits in this many bytes. Above h2's 1 KiB, so the
/// buffer it writes ahead of a chained payload is held; small enough that copying what is held
/// costs less than the system call it saves.
const HOLD: usize = 4 * 1024;

/// An accepted connection whose writes are joined until a flush; see the module's comment.
#[derive(Debug)]
pub struct JoinedWrites<T> {
    io: T,
    /// Accepted and not yet written; goes out before anything written after it.
    held: Vec<u8>,
}

impl<T> JoinedWrites<T> {
    pub fn new(io: T) -> Self {
        JoinedWrites {
            io,
            held: Vec::new(),
        }
    }

    /// The connection itself.
    pub fn get_ref(&self) -> &T {
        &self.io
    }

    /// Each connection a listener's `incoming` stream accepts, wrapped; errors pass through.
    pub fn each<E>(
        incoming: impl Stream<Item = Result<T, E>>,
    ) -> impl Stream<Item = Result<Self, E>> {
        incoming.map(|accepted| accepted.map(JoinedWrites::new))
    }
}

impl<T: AsyncWrite + Unpin> JoinedWrites<T> {
    /// Writes what is held, until it is all written or the socket is full.
    fn poll_write_held(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.held.is_empty() {
            let written = ready!(Pin::new(&mut self.io).poll_write(cx, &self.held))?;
            if written == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.held.drain(..written);
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for JoinedWrites<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.held.len() + buf.len() <= HOLD {
            this.held.extend_from_slice(buf);
            return Poll::Ready(Ok(buf.len()));
        }
        // Too much to hold: what is held goes first, with `buf` in the same call.
        while !this.held.is_empty() {
            let both = [IoSlice::new(&this.held), IoSlice::new(buf)];
            let written = ready!(Pin::new(&mut this.io).poll_write_vectored(cx, &both))?;
            if written == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            if written > this.held.len() {
                let of_buf = written - this.held.len();
                this.held.clear();
                return Poll::Ready(Ok(of_buf));
            }
            // Only (some of) what was held went out; `buf` is not taken until some of it goes.
            this.held.drain(..written);
        }
        Pin::new(&mut this.io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_write_held(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_write_held(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }

    /// False, whatever the socket can do: this is what makes h2 copy payloads under 1 KiB.
    fn is_write_vectored(&self) -> bool {
        false
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for JoinedWrites<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<T: Connected> Connected for JoinedWrites<T> {
    type ConnectInfo = T::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use std::{collections::VecDeque, task::Waker};

    use super::*;

    /// What the socket does with the next write.
    #[derive(Debug, Clone, Copy)]
    enum Socket {
        /// Takes at most this many bytes.
        Takes(usize),
        /// Is full: the write waits.
        Full,
        /// Takes nothing and says so.
        Zero,
    }

    /// A socket that does vectored writes and follows a script; records each call's bytes.
    #[derive(Default)]
    struct Scripted {
        script: VecDeque<Socket>,
        calls: Vec<Vec<u8>>,
        flushes: usize,
    }

    impl Scripted {
        fn take(&mut self, slices: &[&[u8]]) -> Poll<io::Result<usize>> {
            let limit = match self.script.pop_front().unwrap_or(Socket::Takes(usize::MAX)) {
                Socket::Takes(limit) => limit,
                Socket::Full => return Poll::Pending,
                Socket::Zero => return Poll::Ready(Ok(0)),
            };
            let all: Vec<u8> = slices.concat();
            let taken = all[..all.len().min(limit)].to_vec();
            let n = taken.len();
            self.calls.push(taken);
            Poll::Ready(Ok(n))
        }

        fn written(&self) -> Vec<u8> {
            self.calls.concat()
        }
    }

    impl AsyncWrite for Scripted {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.get_mut().take(&[buf])
        }

        fn poll_write_vectored(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            bufs: &[IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            let slices: Vec<&[u8]> = bufs.iter().map(|b| &**b).collect();
            self.get_mut().take(&slices)
        }

        fn is_write_vectored(&self) -> bool {
            true
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.get_mut().flushes += 1;
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    fn joined(script: &[Socket]) -> JoinedWrites<Scripted> {
        JoinedWrites::new(Scripted {
            script: script.iter().copied().collect(),
            ..Scripted::default()
        })
    }

    fn write(w: &mut JoinedWrites<Scripted>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(w).poll_write(&mut Context::from_waker(Waker::noop()), buf)
    }

    fn flush(w: &mut JoinedWrites<Scripted>) -> Poll<io::Result<()>> {
        Pin::new(w).poll_flush(&mut Context::from_waker(Waker::noop()))
    }

    fn bytes(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| seed.wrapping_add(i as u8)).collect()
    }

    #[test]
    fn says_it_does_no_vectored_writes_whatever_the_socket_does() {
        assert!(Scripted::default().is_write_vectored());
        assert!(!joined(&[]).is_write_vectored());
    }

    #[test]
    fn small_writes_leave_together_at_the_flush() {
        let mut w = joined(&[]);
        let (headers, trailers) = (bytes(700, 1), bytes(60, 2));
        assert!(matches!(write(&mut w, &headers), Poll::Ready(Ok(700))));
        assert!(matches!(write(&mut w, &trailers), Poll::Ready(Ok(60))));
        assert!(w.io.calls.is_empty(), "nothing is written before the flush");
        assert!(matches!(flush(&mut w), Poll::Ready(Ok(()))));
        assert_eq!(w.io.calls, vec![[headers, trailers].concat()]);
        assert_eq!(w.io.flushes, 1);
    }

    #[test]
    fn a_write_that_does_not_fit_leaves_with_what_is_held_in_one_call() {
        let mut w = joined(&[]);
        let (head, payload) = (bytes(1024, 3), bytes(HOLD, 4));
        assert!(matches!(write(&mut w, &head), Poll::Ready(Ok(1024))));
        assert!(matches!(write(&mut w, &payload), Poll::Ready(Ok(n)) if n == HOLD));
        assert_eq!(w.io.calls, vec![[head, payload].concat()]);
        assert!(matches!(flush(&mut w), Poll::Ready(Ok(()))));
        assert_eq!(
            w.io.calls.len(),
            1,
            "nothing was left to write at the flush"
        );
    }

    #[test]
    fn a_full_socket_makes_the_write_wait_and_takes_none_of_it_until_some_leaves() {
        // The held kilobyte goes out in two parts, 300 and 724 bytes, with the socket full after
        // each; the payload is not taken while any of what was held is still waiting.
        let mut w = joined(&[
            Socket::Takes(300),
            Socket::Full,
            Socket::Takes(724),
            Socket::Full,
        ]);
        let (head, payload) = (bytes(1024, 5), bytes(HOLD, 6));
        assert!(matches!(write(&mut w, &head), Poll::Ready(Ok(1024))));
        assert!(write(&mut w, &payload).is_pending());
        assert!(write(&mut w, &payload).is_pending());
        assert_eq!(
            w.io.written(),
            head,
            "all of what was held, none of the payload"
        );
        // Now nothing is held and the payload fits: it is held until the flush.
        assert!(matches!(write(&mut w, &payload), Poll::Ready(Ok(n)) if n == HOLD));
        assert_eq!(w.io.written().len(), 1024);
        assert!(matches!(flush(&mut w), Poll::Ready(Ok(()))));
        assert!(w.io.written() == [head, payload].concat());
    }

    #[test]
    fn a_socket_that_takes_nothing_is_an_error_not_a_loop() {
        let mut w = joined(&[Socket::Zero]);
        assert!(write(&mut w, &bytes(10, 7)).is_ready());
        assert!(matches!(
            flush(&mut w),
            Poll::Ready(Err(e)) if e.kind() == io::ErrorKind::WriteZero
        ));
        let mut w = joined(&[Socket::Zero]);
        assert!(write(&mut w, &bytes(10, 7)).is_ready());
        assert!(matches!(
            write(&mut w, &bytes(HOLD, 8)),
            Poll::Ready(Err(e)) if e.kind() == io::ErrorKind::WriteZero
        ));
    }

    /// Any mix of write sizes, flushes, partial writes and full sockets: the socket receives
    /// exactly the bytes accepted, in order; a write is never answered "0 bytes taken"; nothing
    /// is held after a flush that completed; never more than [`HOLD`] bytes are held.
    #[test]
    fn the_socket_gets_exactly_what_was_accepted_in_order() {
        let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = move |below: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % below
        };
        for _ in 0..200 {
            let script = (0..40)
                .map(|_| match next(4) {
                    0 => Socket::Full,
                    1 => Socket::Takes(1 + next(700) as usize),
                    _ => Socket::Takes(usize::MAX),
                })
                .collect::<Vec<_>>();
            let mut w = joined(&script);
            let mut accepted = Vec::new();
            for op in 0..30u8 {
                if next(5) == 0 {
                    let _ = flush(&mut w);
                    continue;
                }
                let data = bytes(1 + next(2 * HOLD as u64) as usize, op);
                match write(&mut w, &data) {
                    Poll::Ready(Ok(n)) => {
                        assert!(n > 0, "a write of {} bytes answered 0", data.len());
                        accepted.extend_from_slice(&data[..n]);
                    }
                    Poll::Ready(Err(e)) => panic!("the scripted socket has no errors: {e}"),
                    Poll::Pending => {}
                }
                assert!(w.held.len() <= HOLD);
            }
            // Each poll takes one step of the script; past its end the socket takes everything.
            let flushed = (0..=script.len()).find(|_| flush(&mut w).is_ready());
            assert!(
                flushed.is_some(),
                "the flush completes once the socket has room"
            );
            assert!(w.held.is_empty());
            assert_eq!(w.io.written(), accepted);
        }
    }
}
