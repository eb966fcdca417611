//! What the rendezvous server has yet to send on one connection in the run
//! phase, sent without blocking as the socket takes it.

use super::{MAX_BACKLOG, SERVER_WRITE_TIMEOUT};
use std::io;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::Instant;

/// How [`Backlog::flush`]'s error begins when the socket itself failed (the
/// PE closed its end), not when the PE does not read.
pub(super) const SEND_FAILED: &str = "cannot send to it";

/// Bytes waiting to be sent on one connection, oldest first.
#[derive(Default)]
pub(super) struct Backlog {
    bytes: Vec<u8>,
    /// How many of `bytes` have been sent.
    sent: usize,
    /// When the last byte was sent, or the backlog began.
    progress: Option<Instant>,
}

impl Backlog {
    pub(super) fn is_empty(&self) -> bool {
        self.sent == self.bytes.len()
    }

    fn len(&self) -> usize {
        self.bytes.len() - self.sent
    }

    pub(super) fn push(&mut self, frame: &[u8]) {
        if self.is_empty() {
            self.bytes.clear();
            self.sent = 0;
            self.progress = Some(Instant::now());
        }
        self.bytes.extend_from_slice(frame);
    }

    /// Sends what the socket takes now; `Err` says why the PE counts as dead.
    pub(super) fn flush(&mut self, stream: &TcpStream) -> Result<(), String> {
        while !self.is_empty() {
            match send_nowait(stream, &self.bytes[self.sent..]) {
                Ok(0) => break,
                Ok(n) => {
                    self.sent += n;
                    self.progress = Some(Instant::now());
                }
                Err(e) => return Err(format!("{SEND_FAILED}: {e}")),
            }
        }
        if self.is_empty() {
            *self = Backlog::default();
            return Ok(());
        }
        if self.len() > MAX_BACKLOG {
            return Err(format!("it does not read: {} bytes are waiting for it", self.len()));
        }
        if self.progress.is_some_and(|at| at.elapsed() >= SERVER_WRITE_TIMEOUT) {
            return Err(format!("it has read nothing for {} s", SERVER_WRITE_TIMEOUT.as_secs()));
        }
        if self.sent > self.bytes.len() / 2 {
            self.bytes.drain(..self.sent);
            self.sent = 0;
        }
        Ok(())
    }
}

/// Sends what the socket buffer takes of `bytes` without blocking (and
/// without changing the descriptor's mode, which the reading thread
/// shares): the number of bytes sent, 0 if the buffer is full.
fn send_nowait(stream: &TcpStream, bytes: &[u8]) -> io::Result<usize> {
    loop {
        // SAFETY: `bytes` is a live slice of `bytes.len()` bytes that send
        // only reads; the borrowed stream keeps its descriptor open.
        let n = unsafe {
            libc::send(stream.as_raw_fd(), bytes.as_ptr().cast(), bytes.len(), libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
        };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::WouldBlock => return Ok(0),
            io::ErrorKind::Interrupted => {}
            _ => return Err(e),
        }
    }
}
