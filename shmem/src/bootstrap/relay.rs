//! The run phase of a PE's connection to the launcher's rendezvous: a
//! message channel to every other PE, relayed by the launcher.
//!
//! A [`Relay`] is what a [`super::tcp::Client`] becomes once `init` is done
//! with its allgathers ([`super::tcp::Client::into_relay`]). It sends
//! messages to any PE and, without blocking, collects what has arrived:
//! other PEs' messages and the news of PEs that have ended. The server side
//! is [`super::server`]'s run phase; the frames are [`wire::SEND`],
//! [`wire::DELIVER`] and [`wire::GONE`].
//!
//! Guarantees: the messages from one PE to another arrive in the order they
//! were sent; the news that a PE ended comes after every message it sent.
//! A message to a PE that has ended is dropped; the sender learns of that
//! PE's end from its [`Incoming::Gone`].

use super::tcp::wire;
use crate::error::{Error, Result};
use std::io::{self, Write};
use std::mem::MaybeUninit;
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;

/// Most bytes one [`Relay::poll`] reads from the socket at a time.
const READ_CHUNK: usize = 64 << 10;

/// What [`Relay::poll`] returns, in arrival order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Incoming {
    /// A message PE `from` sent to this PE.
    Message { from: usize, body: Vec<u8> },
    /// PE `rank` has ended: `died` if its connection closed without
    /// goodbye (a crash, a kill, an exit without closing), else it said
    /// goodbye ([`Relay::close`]). `text` says so in words, naming the PE
    /// ("PE 3 died (its connection to the launcher closed; it was killed
    /// by signal 9 (SIGKILL))").
    Gone { rank: usize, died: bool, text: String },
}

/// One PE's message channel to the others through the launcher.
///
/// Dropping it without [`Relay::close`] closes the connection without
/// goodbye, which the other PEs hear of as this PE's death.
pub(crate) struct Relay {
    /// The server's address, for messages.
    addr: String,
    rank: usize,
    size: usize,
    stream: TcpStream,
    /// Bytes received but not yet parsed into frames.
    inbox: Vec<u8>,
    /// Answers still to come for init-phase queries whose wait ended.
    stale_status: usize,
    /// Why an earlier call failed; the relay is not usable after that.
    broken: Option<String>,
}

impl Relay {
    /// Takes over a client's connection after it has said [`wire::RUN`],
    /// with the bytes it has received but not parsed.
    pub(super) fn new(
        addr: String,
        rank: usize,
        size: usize,
        stream: TcpStream,
        inbox: Vec<u8>,
        stale_status: usize,
    ) -> Relay {
        Relay { addr, rank, size, stream, inbox, stale_status, broken: None }
    }

    /// This PE's rank in the world.
    pub(crate) fn rank(&self) -> usize {
        self.rank
    }

    /// Number of PEs in the world.
    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// Sends `body` (at most [`wire::MAX_MESSAGE`] bytes) to PE `to`, which
    /// may be this PE. Blocks only while the socket buffer is full (the
    /// server reads all the time), at most the bootstrap's timeout.
    pub(crate) fn send(&mut self, to: usize, body: &[u8]) -> Result<()> {
        self.usable()?;
        if to >= self.size {
            return Err(Error::bootstrap(format!("a message to PE {to}, in a world of {} PEs", self.size)));
        }
        if body.len() > wire::MAX_MESSAGE {
            return Err(Error::bootstrap(format!(
                "a message of {} bytes exceeds the relay's limit of {} bytes",
                body.len(),
                wire::MAX_MESSAGE
            )));
        }
        let len = 4 + body.len();
        let mut frame = Vec::with_capacity(wire::HEADER_LEN + len);
        frame.push(wire::SEND);
        frame.extend_from_slice(&(len as u64).to_le_bytes());
        frame.extend_from_slice(&(to as u32).to_le_bytes());
        frame.extend_from_slice(body);
        if let Err(e) = self.stream.write_all(&frame) {
            return Err(self.fail(format!("cannot send to the rendezvous server: {e}")));
        }
        Ok(())
    }

    /// Everything that has arrived, in arrival order, without waiting.
    ///
    /// Fails once the connection is lost (the launcher ended) or the server
    /// reports a failure of the job's bootstrap; what arrived before that
    /// is returned first, the error by the next call.
    pub(crate) fn poll(&mut self) -> Result<Vec<Incoming>> {
        self.usable()?;
        let mut got = Vec::new();
        loop {
            if let Err(e) = self.parse_frames(&mut got) {
                return self.after_failure(got, e);
            }
            self.inbox.reserve(READ_CHUNK);
            let read = recv_nowait(&self.stream, self.inbox.spare_capacity_mut());
            if let Ok(Some(n)) = read {
                // SAFETY: recv initialised the first `n` bytes of the spare
                // capacity, which directly follow the inbox's bytes.
                unsafe { self.inbox.set_len(self.inbox.len() + n) };
            }
            let e = match read {
                Ok(Some(0)) => self.fail("the rendezvous server closed the connection (has the launcher ended?)"),
                Ok(Some(_)) => continue,
                Ok(None) => return Ok(got),
                Err(e) => self.fail(format!("connection to the server lost: {e}")),
            };
            return self.after_failure(got, e);
        }
    }

    /// Says goodbye (the other PEs hear that this PE *left*) and closes the
    /// connection.
    pub(crate) fn close(mut self) {
        // Best effort: a server that is gone needs no goodbye.
        let _ = self.stream.write_all(&wire::frame(wire::BYE, &[]));
        let _ = self.stream.shutdown(Shutdown::Both);
    }

    /// Moves every whole frame in `inbox` to `got`.
    fn parse_frames(&mut self, got: &mut Vec<Incoming>) -> Result<()> {
        let mut at = 0;
        let result = loop {
            let Some(header) = self.inbox.get(at..at + wire::HEADER_LEN) else { break Ok(()) };
            let (kind, len) = wire::parse_header(header.try_into().expect("slice of header length"));
            let max = match kind {
                wire::DELIVER => 4 + wire::MAX_MESSAGE,
                wire::GONE => 5 + wire::MAX_TEXT,
                wire::ERROR | wire::STATUS => wire::MAX_TEXT,
                _ => break Err(format!("unexpected message kind {kind:#x} from the server")),
            };
            if len > max as u64 {
                break Err(format!(
                    "the server sent a message of {len} bytes (kind {kind:#x}), over the limit of {max}"
                ));
            }
            let end = at + wire::HEADER_LEN + len as usize;
            let Some(body) = self.inbox.get(at + wire::HEADER_LEN..end) else {
                // Room for the rest, so that reading it does not reallocate
                // in steps.
                self.inbox.reserve(end - self.inbox.len());
                break Ok(());
            };
            at = end;
            match kind {
                wire::DELIVER => match wire::parse_addressed(body) {
                    Some((from, message)) if from < self.size => {
                        got.push(Incoming::Message { from, body: message.to_vec() })
                    }
                    _ => break Err("malformed message from the server".to_string()),
                },
                wire::GONE => match wire::parse_gone(body) {
                    Some((rank, died, text)) if rank < self.size => got.push(Incoming::Gone { rank, died, text }),
                    _ => break Err("malformed news of a PE's end from the server".to_string()),
                },
                wire::STATUS if self.stale_status > 0 => self.stale_status -= 1,
                wire::ERROR => break Err(String::from_utf8_lossy(body).into_owned()),
                _ => break Err(format!("unexpected message kind {kind:#x} from the server")),
            }
        };
        self.inbox.drain(..at);
        result.map_err(|what| self.fail(what))
    }

    /// What a poll that failed with `e` returns: what arrived before, if
    /// anything (the next call returns the error), else `e`.
    fn after_failure(&self, got: Vec<Incoming>, e: Error) -> Result<Vec<Incoming>> {
        if got.is_empty() {
            Err(e)
        } else {
            Ok(got)
        }
    }

    /// Fails if an earlier call failed.
    fn usable(&self) -> Result<()> {
        match &self.broken {
            Some(why) => Err(Error::bootstrap(why.clone())),
            None => Ok(()),
        }
    }

    /// Records a failure (the relay is unusable from now on) and turns it
    /// into an error.
    fn fail(&mut self, what: impl std::fmt::Display) -> Error {
        let msg = format!("rendezvous {}: {what}", self.addr);
        self.broken = Some(msg.clone());
        Error::bootstrap(msg)
    }
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("addr", &self.addr)
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("broken", &self.broken)
            .finish_non_exhaustive()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        // No goodbye: see the type's docs.
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

/// Reads what has arrived into `buf` without blocking (and without changing
/// the descriptor's mode, which blocking sends rely on): `Some(n)` when the
/// first `n` bytes of `buf` were written (0: the end of the stream), `None`
/// if nothing is there.
fn recv_nowait(stream: &TcpStream, buf: &mut [MaybeUninit<u8>]) -> io::Result<Option<usize>> {
    loop {
        // SAFETY: `buf` is a live, exclusively borrowed slice of `buf.len()`
        // bytes, of which recv writes at most that many (never reading
        // them, so they need not be initialised); the borrowed stream keeps
        // its descriptor open.
        let n = unsafe { libc::recv(stream.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        if n >= 0 {
            return Ok(Some(n as usize));
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::WouldBlock => return Ok(None),
            io::ErrorKind::Interrupted => {}
            _ => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bootstrap::server::RendezvousServer;
    use crate::bootstrap::tcp::{Client, Token};
    use crate::bootstrap::Net;
    use std::os::unix::process::ExitStatusExt;
    use std::process::ExitStatus;
    use std::thread;
    use std::time::{Duration, Instant};

    const T: Duration = Duration::from_secs(10);

    /// A server for `n` PEs and their relays, each made after one allgather.
    fn job(n: usize) -> (RendezvousServer, Vec<Relay>) {
        let server = RendezvousServer::start(n).unwrap();
        let (addr, token) = (server.addr().to_string(), server.token());
        let pes: Vec<_> = (0..n)
            .map(|rank| {
                let addr = addr.clone();
                thread::spawn(move || {
                    let mut c = Client::connect(&addr, rank, n, &token, T).unwrap();
                    assert_eq!(c.allgather(&[rank as u8]).unwrap().len(), n);
                    c.into_relay().unwrap()
                })
            })
            .collect();
        let relays = pes.into_iter().map(|h| h.join().unwrap()).collect();
        (server, relays)
    }

    /// Polls until `done` holds for everything received so far.
    fn poll_until(relay: &mut Relay, done: impl Fn(&[Incoming]) -> bool) -> Vec<Incoming> {
        let deadline = Instant::now() + T;
        let mut got = Vec::new();
        while !done(&got) {
            assert!(Instant::now() < deadline, "PE {} waited in vain; it has {got:?}", relay.rank());
            got.extend(relay.poll().unwrap());
            thread::sleep(Duration::from_millis(1));
        }
        got
    }

    /// Message `seq` from `from` to `to`: its length and bytes encode all three.
    fn message(from: usize, to: usize, seq: usize) -> Vec<u8> {
        let mut m = vec![from as u8, to as u8];
        m.extend_from_slice(&(seq as u32).to_le_bytes());
        m.extend((0..(seq * 13 + from) % 300).map(|i| (i + from * 7 + to * 3 + seq) as u8));
        m
    }

    fn gone(got: &[Incoming], who: usize) -> Option<(bool, &str)> {
        got.iter().find_map(|m| match m {
            Incoming::Gone { rank, died, text } if *rank == who => Some((*died, text.as_str())),
            _ => None,
        })
    }

    #[test]
    #[cfg_attr(miri, ignore = "Miri: no sockets (a rendezvous server and TCP clients)")]
    fn three_pes_trade_messages_in_order() {
        const N: usize = 3;
        const EACH: usize = 200;
        let (server, relays) = job(N);
        let pes: Vec<_> = relays
            .into_iter()
            .map(|mut r| {
                thread::spawn(move || {
                    let me = r.rank();
                    // Interleave destinations, this PE included; one big
                    // message crosses many socket buffers.
                    for seq in 0..EACH {
                        for to in 0..N {
                            r.send(to, &message(me, to, seq)).unwrap();
                        }
                    }
                    r.send((me + 1) % N, &vec![me as u8; 3 << 20]).unwrap();
                    let got = poll_until(&mut r, |got| {
                        got.iter().filter(|m| matches!(m, Incoming::Message { .. })).count() == N * EACH + 1
                    });
                    let mut next = [0usize; N];
                    for m in &got {
                        match m {
                            Incoming::Message { from, body } if body.len() == 3 << 20 => {
                                assert_eq!((*from, next[*from]), ((me + N - 1) % N, EACH), "PE {me}");
                                assert!(body.iter().all(|&b| b == *from as u8));
                                next[*from] += 1;
                            }
                            Incoming::Message { from, body } => {
                                assert_eq!(body, &message(*from, me, next[*from]), "PE {me}: from {from}");
                                next[*from] += 1;
                            }
                            Incoming::Gone { rank, died, .. } => {
                                // A PE that finished first: after all its messages.
                                assert!(!died);
                                assert_eq!(next[*rank], EACH + usize::from((me + N - 1) % N == *rank));
                            }
                        }
                    }
                    r.close();
                })
            })
            .collect();
        for h in pes {
            h.join().unwrap();
        }
        server.shutdown();
    }

    #[test]
    #[cfg_attr(miri, ignore = "Miri: no sockets (a rendezvous server and TCP clients)")]
    fn a_dropped_connection_is_news_of_a_death() {
        let (server, mut relays) = job(3);
        relays[1].send(0, b"last words").unwrap();
        let start = Instant::now();
        drop(relays.remove(1)); // no goodbye, as a crashed process
        for r in &mut relays {
            let got = poll_until(r, |got| gone(got, 1).is_some());
            let (died, text) = gone(&got, 1).unwrap();
            assert!(died);
            assert_eq!(text, "PE 1 died (its connection to the launcher closed)");
            if r.rank() == 0 {
                assert_eq!(got[0], Incoming::Message { from: 1, body: b"last words".to_vec() }, "before the news");
            }
        }
        assert!(start.elapsed() < Duration::from_secs(2), "took {:?}", start.elapsed());
        // The others go on.
        relays[1].send(0, b"still here").unwrap();
        let got = poll_until(&mut relays[0], |got| !got.is_empty());
        assert_eq!(got, [Incoming::Message { from: 2, body: b"still here".to_vec() }]);
        server.shutdown();
    }

    #[test]
    #[cfg_attr(miri, ignore = "Miri: no sockets (a rendezvous server and TCP clients)")]
    fn the_news_of_a_death_tells_the_exit_status() {
        let (server, mut relays) = job(2);
        server.pe_exited(1, ExitStatus::from_raw(libc::SIGKILL));
        drop(relays.pop());
        let got = poll_until(&mut relays[0], |got| gone(got, 1).is_some());
        let text = "PE 1 died (its connection to the launcher closed; it was killed by signal 9 (SIGKILL))";
        assert_eq!(gone(&got, 1), Some((true, text)));
        server.shutdown();
    }

    #[test]
    #[cfg_attr(miri, ignore = "Miri: no sockets (a rendezvous server and TCP clients)")]
    fn goodbye_is_news_that_a_pe_left_and_messages_to_it_are_dropped() {
        let (server, mut relays) = job(3);
        relays.pop().unwrap().close();
        for r in &mut relays {
            let got = poll_until(r, |got| gone(got, 2).is_some());
            assert_eq!(got.len(), 1);
            assert_eq!(gone(&got, 2), Some((false, "PE 2 left (it said goodbye to the launcher)")));
        }
        // To PE 2: dropped, no error; the others still hear each other.
        relays[0].send(2, b"too late").unwrap();
        relays[0].send(1, b"to 1").unwrap();
        let got = poll_until(&mut relays[1], |got| !got.is_empty());
        assert_eq!(got, [Incoming::Message { from: 0, body: b"to 1".to_vec() }]);
        assert!(relays[0].poll().unwrap().is_empty());
        let e = relays[0].send(3, b"x").unwrap_err().to_string();
        assert!(e.contains("a message to PE 3, in a world of 3 PEs"), "{e}");
        let e = relays[0].send(1, &vec![0; wire::MAX_MESSAGE + 1]).unwrap_err().to_string();
        assert!(e.contains("exceeds the relay's limit"), "{e}");
        // The relay is still usable after refusing those locally.
        relays[0].send(1, b"ok").unwrap();
        poll_until(&mut relays[1], |got| !got.is_empty());
        server.shutdown();
    }

    #[test]
    #[cfg_attr(miri, ignore = "Miri: no sockets (a rendezvous server and TCP clients)")]
    fn a_pe_that_does_not_read_holds_up_no_one_else() {
        let (server, mut relays) = job(3);
        // 48 MiB for PE 1, which does not read yet: far more than socket
        // buffers hold, so the server keeps it.
        let chunk = 4 << 20;
        for i in 0..12u8 {
            relays[0].send(1, &vec![i; chunk]).unwrap();
        }
        relays[0].send(2, b"meanwhile").unwrap();
        let got = poll_until(&mut relays[2], |got| !got.is_empty());
        assert_eq!(got, [Incoming::Message { from: 0, body: b"meanwhile".to_vec() }]);
        let got = poll_until(&mut relays[1], |got| got.len() == 12);
        for (i, m) in got.iter().enumerate() {
            let Incoming::Message { from: 0, body } = m else { panic!("{m:?}") };
            assert!(body.len() == chunk && body.iter().all(|&b| b == i as u8), "message {i}");
        }
        server.shutdown();
    }

    #[test]
    #[cfg_attr(miri, ignore = "Miri: no sockets (a rendezvous server and TCP clients)")]
    fn the_launcher_ending_fails_the_next_poll() {
        let (server, mut relays) = job(2);
        relays[1].send(0, b"before").unwrap();
        // Wait until it is in PE 0's socket, then stop the server.
        let deadline = Instant::now() + T;
        while relays[0].stream.peek(&mut [0; 1]).unwrap_or(0) == 0 {
            assert!(Instant::now() < deadline);
            thread::sleep(Duration::from_millis(1));
        }
        server.shutdown();
        let got = poll_until(&mut relays[0], |got| !got.is_empty());
        assert_eq!(got, [Incoming::Message { from: 1, body: b"before".to_vec() }]);
        let e = poll_until_err(&mut relays[0]);
        assert!(e.contains("closed the connection"), "{e}");
        assert!(relays[0].send(1, b"x").unwrap_err().to_string().contains("closed the connection"));
    }

    #[test]
    #[cfg_attr(miri, ignore = "Miri: no sockets (a rendezvous server and TCP clients)")]
    fn net_over_the_relay_and_alone() {
        let (server, relays) = job(2);
        let mut nets: Vec<Net> = relays.into_iter().map(Net::Relay).collect();
        assert_eq!((nets[1].rank(), nets[1].size()), (1, 2));
        nets[1].send(0, b"hi").unwrap();
        let deadline = Instant::now() + T;
        let got = loop {
            let got = nets[0].poll().unwrap();
            if !got.is_empty() || Instant::now() > deadline {
                break got;
            }
            thread::sleep(Duration::from_millis(1));
        };
        assert_eq!(got, [Incoming::Message { from: 1, body: b"hi".to_vec() }]);
        for net in nets {
            net.close();
        }
        server.shutdown();

        let mut alone = crate::bootstrap::Bootstrap::Single.into_net().unwrap();
        assert_eq!((alone.rank(), alone.size()), (0, 1));
        alone.send(0, b"me").unwrap();
        assert!(alone.send(1, b"nobody").is_err());
        assert_eq!(alone.poll().unwrap(), [Incoming::Message { from: 0, body: b"me".to_vec() }]);
        assert!(alone.poll().unwrap().is_empty());
        alone.close();
    }

    #[test]
    #[cfg_attr(miri, ignore = "Miri: no sockets (a rendezvous server and TCP clients)")]
    fn strangers_are_still_turned_away() {
        let (server, mut relays) = job(2);
        let addr = server.addr().to_string();
        let e = Client::connect(&addr, 0, 2, &Token([0; 16]), T).err().unwrap().to_string();
        assert!(e.contains("wrong SHMEM_RENDEZVOUS_TOKEN"), "{e}");
        let e = Client::connect(&addr, 1, 2, &server.token(), T).err().unwrap().to_string();
        assert!(e.contains("PE 1 connected twice"), "{e}");
        // A message without a hello is refused and goes nowhere.
        let mut stray = TcpStream::connect(&addr).unwrap();
        let mut body = 0u32.to_le_bytes().to_vec();
        body.extend_from_slice(b"forged");
        stray.write_all(&wire::frame(wire::SEND, &body)).unwrap();
        let (kind, text) = wire::read_frame(&mut stray, |_| Some(wire::MAX_TEXT)).unwrap();
        assert_eq!(kind, wire::ERROR);
        assert!(String::from_utf8_lossy(&text).contains("unexpected message kind 6"));
        // The job's PEs noticed nothing.
        relays[1].send(0, b"real").unwrap();
        let got = poll_until(&mut relays[0], |got| !got.is_empty());
        assert_eq!(got, [Incoming::Message { from: 1, body: b"real".to_vec() }]);
        server.shutdown();
    }

    #[test]
    #[cfg_attr(miri, ignore = "Miri: no sockets (a rendezvous server and TCP clients)")]
    fn a_pe_that_breaks_the_protocol_is_cut_off() {
        let (server, mut relays) = job(2);
        let mut body = 7u32.to_le_bytes().to_vec();
        body.extend_from_slice(b"nowhere");
        relays[1].stream.write_all(&wire::frame(wire::SEND, &body)).unwrap();
        let got = poll_until(&mut relays[0], |got| gone(got, 1).is_some());
        let text =
            "PE 1 died (the launcher closed its connection: protocol error: a message to PE 7, in a world of 2 PEs)";
        assert_eq!(gone(&got, 1), Some((true, text)));
        let e = poll_until_err(&mut relays[1]);
        assert!(e.contains("a message to PE 7"), "{e}");
        server.shutdown();
    }

    fn poll_until_err(relay: &mut Relay) -> String {
        let deadline = Instant::now() + T;
        loop {
            match relay.poll() {
                Ok(_) => assert!(Instant::now() < deadline),
                Err(e) => return e.to_string(),
            }
            thread::sleep(Duration::from_millis(1));
        }
    }
}
