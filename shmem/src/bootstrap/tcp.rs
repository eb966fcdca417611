//! Client side of the launcher's TCP rendezvous.
//!
//! `shmemrun` (or [`crate::launch::Launch`]) runs a small rendezvous server
//! and tells every PE where it is through `SHMEM_RENDEZVOUS`. Each PE connects,
//! says hello with its rank, waits until every PE has connected, and then uses
//! the connection for a few [`Client::allgather`] rounds during `init` before
//! saying goodbye, or before keeping it as a message channel to the other
//! PEs ([`Client::into_relay`]). The server side is [`super::server`]; both
//! ends share the [`wire`] format below.

use super::env;
use super::relay::Relay;
use crate::error::{Error, Result};
use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

pub(crate) mod wire {
    //! The wire format shared by [`Client`](super::Client),
    //! [`Relay`](super::Relay) and the launcher's server.
    //!
    //! Every message is one frame: a kind byte, the body's length (u64 LE), then
    //! the body. Integers are little-endian.
    //!
    //! A connection has two phases. In the *init* phase a PE says [`HELLO`],
    //! waits for [`READY`], and takes part in allgathers ([`GATHER`] →
    //! [`RESULT`]); it ends with [`BYE`], and the connection closes. A PE that
    //! needs a channel to the others after `init` says [`RUN`] instead: its
    //! connection then stays open for the *run* phase, in which it sends
    //! messages to other PEs ([`SEND`]) and receives theirs ([`DELIVER`]) and
    //! news of PEs that ended ([`GONE`]), until it says [`BYE`] or its
    //! connection closes.

    use std::io::{self, Read};

    /// Bytes before a frame's body: the kind and the body length.
    pub(crate) const HEADER_LEN: usize = 9;
    /// First field of a hello, so that a stray connection is told apart.
    pub(crate) const MAGIC: u32 = 0x5348_4d31;
    /// Largest contribution of one PE to one allgather.
    pub(crate) const MAX_PAYLOAD: usize = 64 << 20;
    /// Largest error or status text.
    pub(crate) const MAX_TEXT: usize = 64 << 10;
    /// Largest body of one run-phase message ([`SEND`], [`DELIVER`]).
    pub(crate) const MAX_MESSAGE: usize = 16 << 20;

    /// Client → server: magic u32, rank u32, world size u32, the job's
    /// token (16 bytes).
    pub(crate) const HELLO: u8 = 1;
    /// Client → server: this PE's allgather contribution.
    pub(crate) const GATHER: u8 = 2;
    /// Client → server: this PE is done with the bootstrap (empty body).
    pub(crate) const BYE: u8 = 3;
    /// Client → server: what are you waiting for? (empty body; answered by
    /// [`STATUS`]).
    pub(crate) const QUERY: u8 = 4;
    /// Client → server: this PE is done with `init`'s allgathers and keeps
    /// its connection for messages (empty body). Only after [`READY`] and
    /// outside an allgather; the first `RUN` of any PE ends the job's init
    /// phase.
    pub(crate) const RUN: u8 = 5;
    /// Client → server, after [`RUN`]: destination rank u32, then the
    /// message (at most [`MAX_MESSAGE`] bytes), forwarded as [`DELIVER`].
    /// A message to a PE that has left or died is dropped: the sender is
    /// told of that PE's end by a [`GONE`].
    pub(crate) const SEND: u8 = 6;

    /// Server → client: every PE has connected (empty body).
    pub(crate) const READY: u8 = 0x81;
    /// Server → client: for every PE in rank order, length u64 then bytes.
    pub(crate) const RESULT: u8 = 0x82;
    /// Server → client: UTF-8 text; the bootstrap failed for this PE.
    pub(crate) const ERROR: u8 = 0x83;
    /// Server → client: phase u8, round u64, then the missing ranks, u32 each.
    pub(crate) const STATUS: u8 = 0x84;
    /// Server → client: source rank u32, then the message of a [`SEND`].
    /// The server forwards messages in the order it receives them, so the
    /// messages from one PE to another arrive in the order sent.
    pub(crate) const DELIVER: u8 = 0x85;
    /// Server → client, once the init phase has ended: rank u32, died u8
    /// (1: its connection ended without [`BYE`]; 0: it said [`BYE`]), then
    /// UTF-8 text saying what happened. Sent to every PE still connected,
    /// after everything the PE that ended had sent.
    pub(crate) const GONE: u8 = 0x86;

    /// [`STATUS`] phase: not every PE has connected yet.
    pub(crate) const PHASE_CONNECT: u8 = 0;
    /// [`STATUS`] phase: waiting for allgather contributions.
    pub(crate) const PHASE_GATHER: u8 = 1;
    /// [`STATUS`] phase: the init phase has ended (no PE is waited for).
    pub(crate) const PHASE_RUN: u8 = 2;

    /// Largest body the server accepts for a client message of `kind`, or
    /// `None` for an unknown kind.
    pub(crate) fn max_client_body(kind: u8) -> Option<usize> {
        match kind {
            HELLO => Some(28),
            GATHER => Some(MAX_PAYLOAD),
            BYE | QUERY | RUN => Some(0),
            SEND => Some(4 + MAX_MESSAGE),
            _ => None,
        }
    }

    /// A whole frame.
    pub(crate) fn frame(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + body.len());
        out.push(kind);
        out.extend_from_slice(&(body.len() as u64).to_le_bytes());
        out.extend_from_slice(body);
        out
    }

    /// Splits a frame header into kind and body length.
    pub(crate) fn parse_header(header: &[u8; HEADER_LEN]) -> (u8, u64) {
        let mut len = [0u8; 8];
        len.copy_from_slice(&header[1..]);
        (header[0], u64::from_le_bytes(len))
    }

    /// Reads one frame (blocking), refusing bodies over what `max_body` allows.
    pub(crate) fn read_frame(r: &mut impl Read, max_body: impl Fn(u8) -> Option<usize>) -> io::Result<(u8, Vec<u8>)> {
        let mut header = [0u8; HEADER_LEN];
        r.read_exact(&mut header)?;
        let (kind, len) = parse_header(&header);
        let max = max_body(kind)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("unknown message kind {kind}")))?;
        if len > max as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("message of {len} bytes (kind {kind}) exceeds the limit of {max} bytes"),
            ));
        }
        let mut body = vec![0u8; len as usize];
        r.read_exact(&mut body)?;
        Ok((kind, body))
    }

    /// Body of a [`HELLO`].
    pub(crate) fn hello(rank: u32, size: u32, token: &super::Token) -> Vec<u8> {
        let mut out = Vec::with_capacity(28);
        out.extend_from_slice(&MAGIC.to_le_bytes());
        out.extend_from_slice(&rank.to_le_bytes());
        out.extend_from_slice(&size.to_le_bytes());
        out.extend_from_slice(&token.0);
        out
    }

    /// Rank, world size and token of a [`HELLO`] body, or `None` if it is not one.
    pub(crate) fn parse_hello(body: &[u8]) -> Option<(usize, usize, super::Token)> {
        let word = |i: usize| Some(u32::from_le_bytes(body.get(i..i + 4)?.try_into().ok()?));
        if body.len() != 28 || word(0)? != MAGIC {
            return None;
        }
        Some((word(4)? as usize, word(8)? as usize, super::Token(body[12..28].try_into().ok()?)))
    }

    /// Body of a [`STATUS`].
    pub(crate) fn status(phase: u8, round: u64, missing: &[usize]) -> Vec<u8> {
        let mut out = Vec::with_capacity(9 + 4 * missing.len());
        out.push(phase);
        out.extend_from_slice(&round.to_le_bytes());
        for &rank in missing {
            out.extend_from_slice(&(rank as u32).to_le_bytes());
        }
        out
    }

    /// Phase, round and missing ranks of a [`STATUS`] body.
    pub(crate) fn parse_status(body: &[u8]) -> Option<(u8, u64, Vec<usize>)> {
        let (&phase, rest) = body.split_first()?;
        let round = u64::from_le_bytes(rest.get(..8)?.try_into().ok()?);
        let ranks = rest.get(8..)?;
        if ranks.len() % 4 != 0 {
            return None;
        }
        let missing = ranks.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize).collect();
        Some((phase, round, missing))
    }

    /// The rank and message of a [`SEND`] or [`DELIVER`] body.
    pub(crate) fn parse_addressed(body: &[u8]) -> Option<(usize, &[u8])> {
        let rank = u32::from_le_bytes(body.get(..4)?.try_into().ok()?);
        Some((rank as usize, &body[4..]))
    }

    /// Body of a [`GONE`].
    pub(crate) fn gone(rank: u32, died: bool, text: &str) -> Vec<u8> {
        let mut out = Vec::with_capacity(5 + text.len());
        out.extend_from_slice(&rank.to_le_bytes());
        out.push(u8::from(died));
        out.extend_from_slice(text.as_bytes());
        out
    }

    /// Rank, died flag and text of a [`GONE`] body.
    pub(crate) fn parse_gone(body: &[u8]) -> Option<(usize, bool, String)> {
        let rank = u32::from_le_bytes(body.get(..4)?.try_into().ok()?);
        let died = match body.get(4)? {
            0 => false,
            1 => true,
            _ => return None,
        };
        Some((rank as usize, died, String::from_utf8_lossy(&body[5..]).into_owned()))
    }

    /// Splits a [`RESULT`] body into exactly `size` contributions.
    pub(crate) fn parse_result(body: &[u8], size: usize) -> Option<Vec<Vec<u8>>> {
        let mut parts = Vec::with_capacity(size);
        let mut rest = body;
        for _ in 0..size {
            let len = u64::from_le_bytes(rest.get(..8)?.try_into().ok()?);
            if len > MAX_PAYLOAD as u64 {
                return None;
            }
            let part = rest.get(8..8 + len as usize)?;
            parts.push(part.to_vec());
            rest = &rest[8 + len as usize..];
        }
        rest.is_empty().then_some(parts)
    }

    /// "PE 2", "PEs 2 and 5", "PEs 1, 2, 3, 4, 5, 6, 7, 8 and 4 more".
    pub(crate) fn list_pes(ranks: &[usize]) -> String {
        const SHOWN: usize = 8;
        let names: Vec<String> = ranks.iter().take(SHOWN).map(|r| r.to_string()).collect();
        match ranks.len() {
            0 => "no PE".to_string(),
            1 => format!("PE {}", names[0]),
            n if n <= SHOWN => {
                format!("PEs {} and {}", names[..n - 1].join(", "), names[n - 1])
            }
            n => format!("PEs {} and {} more", names.join(", "), n - SHOWN),
        }
    }
}

/// How long a timed-out client waits for the server to say what it is
/// waiting for, so that the error can name the missing PEs.
const QUERY_GRACE: Duration = Duration::from_secs(1);

/// A job's rendezvous token: 16 random bytes the launcher makes and gives
/// its PEs (`SHMEM_RENDEZVOUS_TOKEN`, hex). A connection to the rendezvous
/// that does not present it is turned away, so no other local process can
/// join a job or feed it data.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Token(pub(crate) [u8; 16]);

impl Token {
    /// 16 bytes from the kernel's random source (`getrandom(2)`).
    pub(crate) fn random() -> std::io::Result<Token> {
        let mut b = [0u8; 16];
        let mut got = 0;
        while got < b.len() {
            // SAFETY: writes at most `b.len() - got` bytes into `b[got..]`.
            let n = unsafe { libc::getrandom(b[got..].as_mut_ptr().cast(), b.len() - got, 0) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(e);
                }
            } else {
                got += n as usize;
            }
        }
        Ok(Token(b))
    }

    pub(crate) fn to_hex(self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn from_hex(s: &str) -> Option<Token> {
        if s.len() != 32 || !s.is_ascii() {
            return None;
        }
        let mut b = [0u8; 16];
        for (i, out) in b.iter_mut().enumerate() {
            *out = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(Token(b))
    }
}

// The token is a secret: never printed.
impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

/// The launcher-given identity of this process.
#[derive(Debug, Clone, PartialEq, Eq)]
struct EnvConfig {
    rank: usize,
    size: usize,
    addr: String,
    token: Token,
}

impl EnvConfig {
    /// Reads and checks the launcher's variables through `get` (the process
    /// environment, or a map in tests).
    fn from_lookup(get: impl Fn(&str) -> Option<OsString>) -> Result<EnvConfig> {
        let text = |name: &str| -> Result<String> {
            let value = get(name).ok_or_else(|| {
                Error::bootstrap(format!(
                    "{name} is not set (shmemrun sets {}, {} and {} for every PE)",
                    env::RANK,
                    env::WORLD_SIZE,
                    env::RENDEZVOUS
                ))
            })?;
            value
                .into_string()
                .map(|s| s.trim().to_string())
                .map_err(|v| Error::bootstrap(format!("{name}={v:?} is not valid UTF-8")))
        };
        let number = |name: &str| -> Result<usize> {
            let value = text(name)?;
            value.parse().map_err(|_| Error::bootstrap(format!("{name}={value:?} is not a non-negative integer")))
        };
        let rank = number(env::RANK)?;
        let size = number(env::WORLD_SIZE)?;
        if size == 0 {
            return Err(Error::bootstrap(format!("{}=0: a job needs at least one PE", env::WORLD_SIZE)));
        }
        if rank >= size {
            return Err(Error::bootstrap(format!("{}={rank} is not below {}={size}", env::RANK, env::WORLD_SIZE)));
        }
        let addr = text(env::RENDEZVOUS)?;
        if addr.is_empty() {
            return Err(Error::bootstrap(format!(
                "{} is empty (expected host:port of the launcher's rendezvous server)",
                env::RENDEZVOUS
            )));
        }
        let token = text(env::RENDEZVOUS_TOKEN)?;
        let token = Token::from_hex(&token).ok_or_else(|| {
            Error::bootstrap(format!("{} is not 32 hex digits (shmemrun sets it for every PE)", env::RENDEZVOUS_TOKEN))
        })?;
        Ok(EnvConfig { rank, size, addr, token })
    }
}

/// Formats a duration for messages: "30 s", "0.25 s".
fn secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{s:.0} s")
    } else {
        format!("{s:.2} s")
    }
}

/// What a client is waiting for, to word a timeout.
#[derive(Clone, Copy)]
enum Wait {
    /// The other PEs to connect.
    Connect,
    /// The given (1-based) allgather round.
    Gather(u64),
}

/// One PE's connection to the launcher's rendezvous server.
pub(crate) struct Client {
    /// The server's address as the launcher gave it, for messages.
    addr: String,
    rank: usize,
    size: usize,
    /// Longest wait for any one reply.
    timeout: Duration,
    /// `None` once closed.
    stream: Option<TcpStream>,
    /// Bytes received but not yet parsed into a frame; kept across timed-out
    /// reads so that a frame split by a timeout is not lost.
    inbox: Vec<u8>,
    /// Answers still to come for queries whose wait already ended.
    stale_status: usize,
    /// Allgather rounds started so far.
    round: u64,
    /// Why an earlier call failed; the connection is not usable after that.
    broken: Option<String>,
}

impl Client {
    /// Reads `SHMEM_RANK`, `SHMEM_WORLD_SIZE` and `SHMEM_RENDEZVOUS`,
    /// connects (retrying until `timeout`), says hello and waits (within the
    /// same `timeout`) until every PE of the job has connected.
    pub(crate) fn connect_from_env(timeout: Duration) -> Result<Client> {
        let cfg = EnvConfig::from_lookup(|name| std::env::var_os(name))?;
        Client::connect(&cfg.addr, cfg.rank, cfg.size, &cfg.token, timeout)
    }

    /// Like [`Client::connect_from_env`], with the identity given directly.
    pub(crate) fn connect(addr: &str, rank: usize, size: usize, token: &Token, timeout: Duration) -> Result<Client> {
        if rank >= size || u32::try_from(size).is_err() {
            return Err(Error::bootstrap(format!("rank {rank} is not valid in a world of {size} PEs")));
        }
        let deadline = deadline_after(timeout);
        let stream = connect_until(addr, deadline, timeout)?;
        let prepare = |s: &TcpStream| -> io::Result<()> {
            s.set_nodelay(true)?;
            s.set_write_timeout(Some(timeout.max(Duration::from_millis(1))))
        };
        prepare(&stream).map_err(|e| Error::bootstrap(format!("rendezvous {addr}: cannot set up the socket: {e}")))?;
        let mut client = Client {
            addr: addr.to_string(),
            rank,
            size,
            timeout,
            stream: Some(stream),
            inbox: Vec::new(),
            stale_status: 0,
            round: 0,
            broken: None,
        };
        client.send(wire::HELLO, &wire::hello(rank as u32, size as u32, token))?;
        client.wait_reply(wire::READY, deadline, Wait::Connect)?;
        Ok(client)
    }

    /// This PE's rank in the world.
    pub(crate) fn rank(&self) -> usize {
        self.rank
    }

    /// Number of PEs in the world.
    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// Collective: every PE sends its bytes (lengths may differ); returns all
    /// PEs' bytes in rank order. Waits at most the connect timeout.
    pub(crate) fn allgather(&mut self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.usable()?;
        if data.len() > wire::MAX_PAYLOAD {
            return Err(self.fail(format!(
                "allgather of {} bytes exceeds the bootstrap's limit of {} bytes",
                data.len(),
                wire::MAX_PAYLOAD
            )));
        }
        self.round += 1;
        let deadline = deadline_after(self.timeout);
        self.send(wire::GATHER, data)?;
        let body = self.wait_reply(wire::RESULT, deadline, Wait::Gather(self.round))?;
        wire::parse_result(&body, self.size).ok_or_else(|| {
            self.fail(format!(
                "malformed allgather #{} result ({} bytes for {} PEs)",
                self.round,
                body.len(),
                self.size
            ))
        })
    }

    /// Ends this PE's init phase ([`wire::RUN`]) and keeps the connection
    /// as a message channel to the other PEs. Called instead of
    /// [`Client::close`] once `init` is done with its allgathers.
    pub(crate) fn into_relay(mut self) -> Result<Relay> {
        self.usable()?;
        self.send(wire::RUN, &[])?;
        let stream = self.stream.take().expect("a usable client has a stream");
        let inbox = std::mem::take(&mut self.inbox);
        Ok(Relay::new(std::mem::take(&mut self.addr), self.rank, self.size, stream, inbox, self.stale_status))
    }

    /// Says goodbye and closes the connection (idempotent); also done on Drop.
    pub(crate) fn close(&mut self) {
        if let Some(mut stream) = self.stream.take() {
            // Best effort: a server that is gone needs no goodbye.
            let _ = stream.write_all(&wire::frame(wire::BYE, &[]));
            let _ = stream.shutdown(Shutdown::Both);
        }
    }

    /// Fails if the connection is closed or an earlier call failed.
    fn usable(&self) -> Result<()> {
        if self.stream.is_none() {
            return Err(Error::bootstrap(format!("rendezvous {}: the connection is already closed", self.addr)));
        }
        if let Some(why) = &self.broken {
            return Err(Error::bootstrap(format!("an earlier bootstrap operation failed: {why}")));
        }
        Ok(())
    }

    /// Records a failure (the connection is unusable from now on) and turns
    /// it into an error.
    fn fail(&mut self, what: impl std::fmt::Display) -> Error {
        let msg = format!("rendezvous {}: {what}", self.addr);
        self.broken = Some(msg.clone());
        Error::bootstrap(msg)
    }

    fn send(&mut self, kind: u8, body: &[u8]) -> Result<()> {
        let stream = self.stream.as_mut().expect("send on a closed client");
        match stream.write_all(&wire::frame(kind, body)) {
            Ok(()) => Ok(()),
            Err(e) => Err(self.fail(format!("cannot send to the rendezvous server: {e}"))),
        }
    }

    /// Waits for a frame of kind `expected` until `deadline`; on timeout,
    /// asks the server which PEs it is still waiting for.
    fn wait_reply(&mut self, expected: u8, deadline: Instant, what: Wait) -> Result<Vec<u8>> {
        while let Some((kind, body)) = self.read_frame(deadline)? {
            if kind == wire::STATUS && self.stale_status > 0 {
                self.stale_status -= 1;
            } else if kind == expected {
                return Ok(body);
            } else {
                return Err(self.unexpected(kind, &body));
            }
        }
        // Timed out. The server answers queries at once, so a short extra
        // wait tells which PEs are missing.
        self.send(wire::QUERY, &[])?;
        let grace = Instant::now() + QUERY_GRACE;
        let waited = secs(self.timeout);
        loop {
            let Some((kind, body)) = self.read_frame(grace)? else {
                return Err(self.fail(format!(
                    "{} did not finish within {waited}, and the rendezvous server does not answer",
                    match what {
                        Wait::Connect => "connecting to the other PEs".to_string(),
                        Wait::Gather(round) => format!("allgather #{round}"),
                    }
                )));
            };
            if kind == wire::STATUS && self.stale_status > 0 {
                self.stale_status -= 1;
            } else if kind == wire::STATUS {
                let Some((phase, round, missing)) = wire::parse_status(&body) else {
                    return Err(self.fail("malformed status message from the server"));
                };
                let who = wire::list_pes(&missing);
                let msg = match (what, phase) {
                    (Wait::Connect, wire::PHASE_CONNECT) => {
                        let verb = if missing.len() == 1 { "has" } else { "have" };
                        format!("{who} {verb} not connected within {waited}")
                    }
                    (_, wire::PHASE_GATHER) => {
                        format!("allgather #{} timed out after {waited} waiting for {who}", round + 1)
                    }
                    _ => format!("timed out after {waited}"),
                };
                return Err(self.fail(msg));
            } else if kind == expected {
                // The reply came just late; the status answer is now stale.
                self.stale_status += 1;
                return Ok(body);
            } else {
                return Err(self.unexpected(kind, &body));
            }
        }
    }

    /// The error for a frame that is not the awaited one.
    fn unexpected(&mut self, kind: u8, body: &[u8]) -> Error {
        if kind == wire::ERROR {
            let text = String::from_utf8_lossy(body).into_owned();
            self.fail(text)
        } else {
            self.fail(format!("unexpected message kind {kind:#x} from the server"))
        }
    }

    /// Reads one frame, or `None` if `deadline` passes first.
    fn read_frame(&mut self, deadline: Instant) -> Result<Option<(u8, Vec<u8>)>> {
        loop {
            let mut want = wire::HEADER_LEN;
            if self.inbox.len() >= wire::HEADER_LEN {
                let header: [u8; wire::HEADER_LEN] =
                    self.inbox[..wire::HEADER_LEN].try_into().expect("slice of header length");
                let (kind, len) = wire::parse_header(&header);
                let max = match kind {
                    wire::READY => 0,
                    wire::RESULT => self.size.saturating_mul(8 + wire::MAX_PAYLOAD),
                    wire::ERROR | wire::STATUS => wire::MAX_TEXT,
                    _ => return Err(self.fail(format!("unknown message kind {kind:#x} from the server"))),
                };
                if len > max as u64 {
                    return Err(self.fail(format!(
                        "the server sent a message of {len} bytes (kind {kind:#x}), over the limit of {max}"
                    )));
                }
                let total = wire::HEADER_LEN + len as usize;
                if self.inbox.len() >= total {
                    let body = self.inbox[wire::HEADER_LEN..total].to_vec();
                    self.inbox.drain(..total);
                    return Ok(Some((kind, body)));
                }
                want = total;
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            let stream = self.stream.as_mut().expect("read on a closed client");
            if let Err(e) = stream.set_read_timeout(Some(deadline - now)) {
                return Err(self.fail(format!("cannot set a read timeout: {e}")));
            }
            // Read at most what the current frame still needs, in chunks of
            // at most 1 MiB so that a huge announced length costs nothing
            // before its bytes arrive.
            let old = self.inbox.len();
            let chunk = (want - old).clamp(wire::HEADER_LEN, 1 << 20);
            self.inbox.resize(old + chunk, 0);
            let got = stream.read(&mut self.inbox[old..]);
            self.inbox.truncate(old + *got.as_ref().unwrap_or(&0));
            match got {
                Ok(0) => return Err(self.fail("the rendezvous server closed the connection (has the launcher ended?)")),
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
                    ) => {}
                Err(e) => return Err(self.fail(format!("connection to the server lost: {e}"))),
            }
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.close();
    }
}

/// `timeout` from now; a timeout too long for the clock (`Duration::MAX`,
/// `SHMEM_PEER_TIMEOUT=1e18`) waits a century instead of overflowing.
fn deadline_after(timeout: Duration) -> Instant {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    let now = Instant::now();
    now.checked_add(timeout).unwrap_or_else(|| now + CENTURY)
}

/// Connects to `addr`, retrying (the launcher may still be starting) until
/// `deadline`.
fn connect_until(addr: &str, deadline: Instant, timeout: Duration) -> Result<TcpStream> {
    let targets: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| Error::bootstrap(format!("{}={addr:?} is not a usable host:port address: {e}", env::RENDEZVOUS)))?
        .collect();
    if targets.is_empty() {
        return Err(Error::bootstrap(format!("{}={addr:?} resolves to no address", env::RENDEZVOUS)));
    }
    let mut pause = Duration::from_millis(10);
    loop {
        let mut last_err = None;
        for target in &targets {
            let left = deadline.saturating_duration_since(Instant::now());
            let attempt = left.clamp(Duration::from_millis(10), Duration::from_secs(2));
            match TcpStream::connect_timeout(target, attempt) {
                Ok(stream) => return Ok(stream),
                Err(e) => last_err = Some(e),
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            let e = last_err.expect("at least one address was tried");
            return Err(Error::bootstrap(format!("rendezvous {addr}: cannot connect within {}: {e}", secs(timeout))));
        }
        std::thread::sleep(pause.min(left));
        pause = (pause * 2).min(Duration::from_millis(250));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bootstrap::server::RendezvousServer;
    use std::collections::HashMap;
    use std::thread;

    fn lookup(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let map: HashMap<String, OsString> = vars.iter().map(|(k, v)| (k.to_string(), OsString::from(v))).collect();
        move |name| map.get(name).cloned()
    }

    fn env_error(vars: &[(&str, &str)]) -> String {
        EnvConfig::from_lookup(lookup(vars)).unwrap_err().to_string()
    }

    #[test]
    fn env_is_read_and_checked() {
        let ok = EnvConfig::from_lookup(lookup(&[
            ("SHMEM_RANK", "2"),
            ("SHMEM_WORLD_SIZE", " 4"),
            ("SHMEM_RENDEZVOUS", "127.0.0.1:4000"),
            ("SHMEM_RENDEZVOUS_TOKEN", "000102030405060708090a0b0c0d0e0f"),
        ]))
        .unwrap();
        let token = Token(std::array::from_fn(|i| i as u8));
        assert_eq!(ok, EnvConfig { rank: 2, size: 4, addr: "127.0.0.1:4000".into(), token });
        let e = env_error(&[("SHMEM_RANK", "0"), ("SHMEM_WORLD_SIZE", "1"), ("SHMEM_RENDEZVOUS", "x:1")]);
        assert!(e.contains("SHMEM_RENDEZVOUS_TOKEN is not set"), "{e}");
        let bad = [("SHMEM_RANK", "0"), ("SHMEM_WORLD_SIZE", "1"), ("SHMEM_RENDEZVOUS", "x:1")];
        let e = env_error(&[bad[0], bad[1], bad[2], ("SHMEM_RENDEZVOUS_TOKEN", "0011")]);
        assert!(e.contains("SHMEM_RENDEZVOUS_TOKEN is not 32 hex digits"), "{e}");
        assert_eq!(Token::from_hex(&token.to_hex()), Some(token));

        let e = env_error(&[("SHMEM_RANK", "5"), ("SHMEM_WORLD_SIZE", "4"), ("SHMEM_RENDEZVOUS", "x:1")]);
        assert!(e.contains("SHMEM_RANK=5 is not below SHMEM_WORLD_SIZE=4"), "{e}");
        let e = env_error(&[("SHMEM_WORLD_SIZE", "4"), ("SHMEM_RENDEZVOUS", "x:1")]);
        assert!(e.contains("SHMEM_RANK is not set"), "{e}");
        let e = env_error(&[("SHMEM_RANK", "one"), ("SHMEM_WORLD_SIZE", "4")]);
        assert!(e.contains("SHMEM_RANK=\"one\" is not a non-negative integer"), "{e}");
        let e = env_error(&[("SHMEM_RANK", "0"), ("SHMEM_WORLD_SIZE", "0")]);
        assert!(e.contains("SHMEM_WORLD_SIZE=0"), "{e}");
        let e = env_error(&[("SHMEM_RANK", "0"), ("SHMEM_WORLD_SIZE", "1")]);
        assert!(e.contains("SHMEM_RENDEZVOUS is not set"), "{e}");
        let e = env_error(&[("SHMEM_RANK", "0"), ("SHMEM_WORLD_SIZE", "1"), ("SHMEM_RENDEZVOUS", " ")]);
        assert!(e.contains("SHMEM_RENDEZVOUS is empty"), "{e}");
    }

    #[test]
    fn wire_helpers_round_trip() {
        let token = Token([7; 16]);
        assert_eq!(wire::parse_hello(&wire::hello(3, 8, &token)), Some((3, 8, token)));
        assert_eq!(wire::parse_hello(&[0; 12]), None);
        assert_eq!(wire::parse_hello(&[0; 28]), None);
        let st = wire::status(wire::PHASE_GATHER, 7, &[1, 4]);
        assert_eq!(wire::parse_status(&st), Some((wire::PHASE_GATHER, 7, vec![1, 4])));
        let mut body = Vec::new();
        for part in [&b"ab"[..], b"", b"xyz"] {
            body.extend_from_slice(&(part.len() as u64).to_le_bytes());
            body.extend_from_slice(part);
        }
        let parts = wire::parse_result(&body, 3).unwrap();
        assert_eq!(parts, vec![b"ab".to_vec(), vec![], b"xyz".to_vec()]);
        assert_eq!(wire::parse_result(&body, 2), None, "trailing bytes");
        assert_eq!(wire::parse_result(&body, 4), None, "missing part");
        assert_eq!(wire::list_pes(&[2]), "PE 2");
        assert_eq!(wire::list_pes(&[2, 3, 5]), "PEs 2, 3 and 5");
        assert_eq!(wire::list_pes(&(0..10).collect::<Vec<_>>()), "PEs 0, 1, 2, 3, 4, 5, 6, 7 and 2 more");
    }

    /// The bytes PE `rank` contributes to round `round`: lengths differ per
    /// PE and per round, contents encode both.
    fn payload(rank: usize, round: usize) -> Vec<u8> {
        (0..rank * 7 + round * 3).map(|i| (rank * 31 + round * 17 + i) as u8).collect()
    }

    #[test]
    #[cfg_attr(miri, ignore = "Miri: no sockets (a rendezvous server and TCP clients)")]
    fn allgather_rounds_with_three_clients() {
        let server = RendezvousServer::start(3).unwrap();
        let tok = server.token();
        let addr = server.addr().to_string();
        let handles: Vec<_> = (0..3)
            .map(|rank| {
                let addr = addr.clone();
                thread::spawn(move || {
                    let mut c = Client::connect(&addr, rank, 3, &tok, Duration::from_secs(5)).unwrap();
                    assert_eq!((c.rank(), c.size()), (rank, 3));
                    for round in 0..5 {
                        let all = c.allgather(&payload(rank, round)).unwrap();
                        let want: Vec<_> = (0..3).map(|r| payload(r, round)).collect();
                        assert_eq!(all, want, "rank {rank} round {round}");
                    }
                    // A big contribution crosses many socket buffers.
                    let big = vec![rank as u8; 3 << 20];
                    let all = c.allgather(&big).unwrap();
                    assert!(all.iter().enumerate().all(|(r, p)| p.len() == 3 << 20 && p[0] == r as u8));
                    c.close();
                    c.close(); // idempotent
                    assert!(c.allgather(b"x").unwrap_err().to_string().contains("closed"));
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        server.shutdown();
    }

    #[test]
    #[cfg_attr(miri, ignore = "Miri: no sockets (a rendezvous server and TCP clients)")]
    fn single_pe_world() {
        let server = RendezvousServer::start(1).unwrap();
        let tok = server.token();
        let mut c = Client::connect(&server.addr().to_string(), 0, 1, &tok, Duration::from_secs(5)).unwrap();
        assert_eq!(c.allgather(b"alone").unwrap(), vec![b"alone".to_vec()]);
        drop(c);
        server.shutdown();
    }

    #[test]
    #[cfg_attr(miri, ignore = "Miri: no sockets (a rendezvous server and TCP clients)")]
    fn disconnect_without_goodbye_fails_the_others() {
        let server = RendezvousServer::start(3).unwrap();
        let tok = server.token();
        let addr = server.addr().to_string();
        let handles: Vec<_> = (0..3)
            .map(|rank| {
                let addr = addr.clone();
                thread::spawn(move || {
                    let mut c = Client::connect(&addr, rank, 3, &tok, Duration::from_secs(5)).unwrap();
                    c.allgather(&[rank as u8]).unwrap();
                    if rank == 1 {
                        // Vanish as a crashed process would: no goodbye.
                        c.stream.take().unwrap().shutdown(Shutdown::Both).unwrap();
                        return None;
                    }
                    let start = Instant::now();
                    let err = c.allgather(b"second").unwrap_err().to_string();
                    assert!(start.elapsed() < Duration::from_secs(2), "waited {:?}", start.elapsed());
                    Some(err)
                })
            })
            .collect();
        for h in handles {
            if let Some(err) = h.join().unwrap() {
                assert!(err.contains("PE 1 left during bootstrap"), "{err}");
            }
        }
        server.shutdown();
    }

    #[test]
    #[cfg_attr(miri, ignore = "Miri: no sockets (a rendezvous server and TCP clients)")]
    fn timeout_names_the_missing_pe() {
        let server = RendezvousServer::start(3).unwrap();
        let tok = server.token();
        let addr = server.addr().to_string();
        // PE 2 never comes.
        let handles: Vec<_> = (0..2)
            .map(|rank| {
                let addr = addr.clone();
                thread::spawn(move || {
                    Client::connect(&addr, rank, 3, &tok, Duration::from_millis(300)).err().unwrap().to_string()
                })
            })
            .collect();
        for h in handles {
            // Either the server's status ("PE 2 has not connected within
            // 0.30 s") or, if the other PE gave up first, its message; both
            // name PE 2.
            let err = h.join().unwrap();
            assert!(err.contains(&format!("rendezvous {addr}: ")), "{err}");
            assert!(
                err.contains("PE 2 has not connected within 0.30 s") || err.contains("PE 2 had not connected"),
                "{err}"
            );
        }
        server.shutdown();

        // In a round: PE 0 and 1 gather, PE 2 connects but never gathers
        // (it stays connected until they have given up).
        let server = RendezvousServer::start(3).unwrap();
        let tok = server.token();
        let addr = server.addr().to_string();
        let handles: Vec<_> = (0..2)
            .map(|rank| {
                let addr = addr.clone();
                thread::spawn(move || {
                    let mut c = Client::connect(&addr, rank, 3, &tok, Duration::from_millis(300)).unwrap();
                    c.allgather(b"x").unwrap_err().to_string()
                })
            })
            .collect();
        let idle = Client::connect(&addr, 2, 3, &tok, Duration::from_secs(5)).unwrap();
        for h in handles {
            let err = h.join().unwrap();
            assert!(err.contains("allgather #1") && err.contains("waiting for PE 2"), "{err}");
        }
        drop(idle);
        server.shutdown();
    }

    #[test]
    #[cfg_attr(miri, ignore = "Miri: no sockets (a rendezvous server and TCP clients)")]
    fn bad_hellos_are_rejected() {
        let server = RendezvousServer::start(2).unwrap();
        let tok = server.token();
        let addr = server.addr().to_string();
        let t = Duration::from_secs(2);
        let first = thread::spawn({
            let addr = addr.clone();
            move || Client::connect(&addr, 0, 2, &tok, Duration::from_secs(5))
        });
        // Wait until PE 0 is in, then try to be PE 0 again.
        thread::sleep(Duration::from_millis(100));
        let err = Client::connect(&addr, 0, 2, &tok, t).err().unwrap().to_string();
        assert!(err.contains("PE 0 connected twice"), "{err}");
        let err = Client::connect(&addr, 1, 3, &tok, t).err().unwrap().to_string();
        assert!(err.contains("3 PEs"), "{err}");
        let mut one = Client::connect(&addr, 1, 2, &tok, t).unwrap();
        let mut zero = first.join().unwrap().unwrap();
        let h = thread::spawn(move || zero.allgather(b"0").unwrap());
        assert_eq!(one.allgather(b"1").unwrap(), vec![b"0".to_vec(), b"1".to_vec()]);
        h.join().unwrap();
        server.shutdown();
    }

    #[test]
    #[cfg_attr(miri, ignore = "Miri: no sockets (a rendezvous server and TCP clients)")]
    fn goodbye_while_others_gather_is_an_error() {
        let server = RendezvousServer::start(2).unwrap();
        let tok = server.token();
        let addr = server.addr().to_string();
        let t = Duration::from_secs(5);
        let h = thread::spawn({
            let addr = addr.clone();
            move || {
                let mut c = Client::connect(&addr, 0, 2, &tok, t).unwrap();
                c.allgather(b"once").unwrap_err().to_string()
            }
        });
        let c = Client::connect(&addr, 1, 2, &tok, t).unwrap();
        drop(c); // goodbye without joining the round
                 // PE 1's goodbye may reach the server before or after PE 0's
                 // contribution; either way the error says what happened.
        let err = h.join().unwrap();
        assert!(err.contains("PE 1 said goodbye"), "{err}");
        assert!(err.contains("different number of times"), "{err}");
        server.shutdown();
    }

    #[test]
    #[cfg_attr(miri, ignore = "Miri: no sockets (a rendezvous server and TCP clients)")]
    fn nothing_listening_gives_up_at_the_deadline() {
        // Bind then drop to get a port that (very likely) nobody listens on.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let start = Instant::now();
        let err = Client::connect(&format!("127.0.0.1:{port}"), 0, 2, &Token([0; 16]), Duration::from_millis(200))
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("cannot connect within 0.20 s"), "{err}");
        assert!(start.elapsed() < Duration::from_secs(2));
    }

    #[test]
    #[cfg_attr(miri, ignore = "Miri: no sockets (a rendezvous server and TCP clients)")]
    fn an_endless_timeout_does_not_overflow_the_clock() {
        // `Instant::now() + Duration::MAX` panics: a huge SHMEM_PEER_TIMEOUT
        // (or `Config::peer_timeout(Duration::MAX)`) once did that here.
        let server = RendezvousServer::start(1).unwrap();
        let mut c = Client::connect(&server.addr().to_string(), 0, 1, &server.token(), Duration::MAX).unwrap();
        assert_eq!(c.allgather(b"x").unwrap(), vec![b"x".to_vec()]);
        assert!(deadline_after(Duration::MAX) > Instant::now() + Duration::from_secs(1 << 30));
    }

    #[test]
    #[cfg_attr(miri, ignore = "Miri: no sockets (a rendezvous server and TCP clients)")]
    fn a_wrong_token_is_turned_away_and_the_job_goes_on() {
        let server = RendezvousServer::start(1).unwrap();
        let addr = server.addr().to_string();
        let t = Duration::from_secs(5);
        let err = Client::connect(&addr, 0, 1, &Token([0; 16]), t).err().unwrap().to_string();
        assert!(err.contains("wrong SHMEM_RENDEZVOUS_TOKEN"), "{err}");
        let mut c = Client::connect(&addr, 0, 1, &server.token(), t).unwrap();
        assert_eq!(c.allgather(b"x").unwrap(), vec![b"x".to_vec()]);
    }
}
