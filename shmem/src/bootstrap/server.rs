//! Server side of the launcher's TCP rendezvous.
//!
//! [`crate::launch::Launch`] starts one [`RendezvousServer`] per job on
//! `127.0.0.1` and tells every PE where it is (`SHMEM_RENDEZVOUS`) and the
//! job's token (`SHMEM_RENDEZVOUS_TOKEN`). The client side is
//! [`super::tcp::Client`]; both ends share the [`wire`] format.
//!
//! Threads: one accepts connections, one reads each connection's frames,
//! and one, the coordinator, owns all the state and handles what the others
//! hear about in order (an [`Event`] channel), so no state is shared but
//! the registry of open connections that stopping needs.
//!
//! # The run phase
//!
//! Once a PE says [`wire::RUN`], the job's init phase is over and the
//! server relays messages: each [`wire::SEND`] goes out as a
//! [`wire::DELIVER`] to its destination, in the order the coordinator
//! receives them, so the messages from one PE to another keep their order.
//! When a PE's connection ends, every PE still connected hears of it by a
//! [`wire::GONE`], after everything that PE had sent: *left* if it said
//! [`wire::BYE`], *died* if its connection closed without it. The news of
//! a death waits up to [`EXIT_STATUS_WAIT`] for the launcher to report the
//! process's exit status ([`RendezvousServer::pe_exited`]), so that it can
//! say how the PE ended. PEs that said goodbye before the first `RUN` are
//! announced as left when it comes. The server runs while any PE is
//! connected.
//!
//! Limits: every message passes through the coordinator thread (one copy
//! in, one out); what a PE does not read waits for it in the server, up to
//! [`MAX_BACKLOG`] bytes or [`SERVER_WRITE_TIMEOUT`] without progress, after
//! which that PE counts as dead. Other PEs' traffic does not wait for it.

mod backlog;

use super::env;
use super::exit::describe_status;
use super::tcp::{wire, Token};
use backlog::Backlog;
use std::collections::HashMap;
use std::io::{self, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::process::ExitStatus;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// How long the accept loop sleeps between looks at the stop flag.
const ACCEPT_POLL: Duration = Duration::from_millis(100);
/// Longest a send to one PE may block the server in the init phase; in the
/// run phase, longest a PE may leave what is sent to it unread.
const SERVER_WRITE_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest the news of a PE whose connection closed without goodbye waits
/// for the launcher to report how its process ended.
const EXIT_STATUS_WAIT: Duration = Duration::from_millis(200);
/// How often the coordinator retries sending what a full socket buffer held
/// back.
const BACKLOG_RETRY: Duration = Duration::from_millis(2);
/// Most bytes held back for a PE that does not read before it counts as dead.
const MAX_BACKLOG: usize = 256 << 20;

/// The launcher's rendezvous server for one job of `n` PEs.
///
/// Accepts the PEs' connections, checks their hellos, tells them when all
/// have connected, then serves allgather rounds and, once PEs ask for it,
/// relays their messages (see the module docs) until every PE has said
/// goodbye or gone. Runs on its own threads; [`RendezvousServer::shutdown`]
/// (or drop) stops it and joins them all.
pub(crate) struct RendezvousServer {
    addr: SocketAddr,
    /// What every PE must present in its hello.
    token: Token,
    shared: Arc<Shared>,
    events: Sender<Event>,
    threads: Vec<JoinHandle<()>>,
}

/// State the server's threads share.
#[derive(Default)]
struct Shared {
    registry: Mutex<Registry>,
}

#[derive(Default)]
struct Registry {
    stopped: bool,
    /// Every accepted connection, to be shut down on stop.
    streams: Vec<Arc<TcpStream>>,
    /// Every connection's reading thread, to be joined on stop.
    readers: Vec<JoinHandle<()>>,
}

impl Shared {
    /// Stops accepting and shuts down every connection, which ends the
    /// reading threads.
    fn stop(&self) {
        let mut reg = lock(&self.registry);
        reg.stopped = true;
        for s in &reg.streams {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

/// What the coordinator thread hears about.
enum Event {
    Opened { id: u64, stream: Arc<TcpStream> },
    Frame { id: u64, kind: u8, body: Vec<u8> },
    Closed { id: u64, why: Close },
    Exited { rank: usize, status: ExitStatus },
    Stop,
}

/// Why a connection ended.
enum Close {
    Eof,
    Io(String),
    Protocol(String),
}

impl RendezvousServer {
    /// Starts a server for `n` PEs on `127.0.0.1`, on a port the OS picks.
    pub(crate) fn start(n: usize) -> io::Result<RendezvousServer> {
        if n == 0 || u32::try_from(n).is_err() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("a rendezvous cannot serve {n} PEs")));
        }
        let listener = TcpListener::bind(("127.0.0.1", 0))?;
        let addr = listener.local_addr()?;
        let token = Token::random()?;
        let shared = Arc::new(Shared::default());
        let (events, inbox) = mpsc::channel();
        let mut server =
            RendezvousServer { addr, token, shared: shared.clone(), events: events.clone(), threads: Vec::new() };
        let accept = thread::Builder::new().name("shmem-rendezvous-accept".into()).spawn({
            let shared = shared.clone();
            move || accept_loop(listener, &shared, &events)
        })?;
        server.threads.push(accept);
        // On failure, dropping `server` stops the accept thread.
        let coordinator = thread::Builder::new()
            .name("shmem-rendezvous".into())
            .spawn(move || Coordinator::new(n, token, shared).run(inbox))?;
        server.threads.push(coordinator);
        Ok(server)
    }

    /// Where the PEs connect.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The token the PEs must present (`SHMEM_RENDEZVOUS_TOKEN`).
    pub(crate) fn token(&self) -> Token {
        self.token
    }

    /// Tells the server that PE `rank`'s process has exited, so that PEs
    /// waiting for one that never connected fail at once.
    pub(crate) fn pe_exited(&self, rank: usize, status: ExitStatus) {
        let _ = self.events.send(Event::Exited { rank, status });
    }

    /// Stops the server and joins its threads.
    pub(crate) fn shutdown(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        self.shared.stop();
        let _ = self.events.send(Event::Stop);
        if self.threads.first().is_some_and(|t| !t.is_finished()) {
            // Wake the acceptor now rather than at its next look at the
            // stop flag; it drops this connection unseen.
            let _ = TcpStream::connect_timeout(&self.addr, ACCEPT_POLL);
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        // The acceptor has ended, so no reader is added any more.
        let readers = std::mem::take(&mut lock(&self.shared.registry).readers);
        for t in readers {
            let _ = t.join();
        }
    }
}

impl Drop for RendezvousServer {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

/// Accepts connections until stopped, starting a reading thread for each.
fn accept_loop(listener: TcpListener, shared: &Shared, events: &Sender<Event>) {
    let mut next_id = 0u64;
    loop {
        if lock(&shared.registry).stopped {
            return;
        }
        if !wait_readable(&listener, ACCEPT_POLL) {
            continue;
        }
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(_) => {
                // Out of descriptors, say: do not spin.
                thread::sleep(ACCEPT_POLL);
                continue;
            }
        };
        let id = next_id;
        next_id += 1;
        let _ = stream.set_nodelay(true);
        let _ = stream.set_write_timeout(Some(SERVER_WRITE_TIMEOUT));
        // One descriptor serves the reader, the coordinator and `stop`.
        let stream = Arc::new(stream);
        let mut reg = lock(&shared.registry);
        if reg.stopped {
            let _ = stream.shutdown(Shutdown::Both);
            return;
        }
        // Opened is sent before the reader exists, so the coordinator knows
        // the connection before any of its frames.
        if events.send(Event::Opened { id, stream: stream.clone() }).is_err() {
            return;
        }
        let tx = events.clone();
        let reader = stream.clone();
        let spawned =
            thread::Builder::new().name(format!("shmem-rendezvous-{id}")).spawn(move || read_loop(id, &reader, &tx));
        match spawned {
            Ok(handle) => reg.readers.push(handle),
            Err(e) => {
                let _ = stream.shutdown(Shutdown::Both);
                let why = Close::Io(format!("the server cannot start a thread for it: {e}"));
                let _ = events.send(Event::Closed { id, why });
            }
        }
        reg.streams.push(stream);
    }
}

/// Waits up to `timeout` for a connection to accept.
fn wait_readable(listener: &TcpListener, timeout: Duration) -> bool {
    let mut pfd = libc::pollfd { fd: listener.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
    // SAFETY: `pfd` is one valid pollfd for the whole call, and the
    // borrowed listener keeps its descriptor open.
    unsafe { libc::poll(&mut pfd, 1, ms) > 0 }
}

/// Reads one connection's frames until it ends.
fn read_loop(id: u64, stream: &TcpStream, events: &Sender<Event>) {
    let why = loop {
        match wire::read_frame(&mut &*stream, wire::max_client_body) {
            Ok((kind, body)) => {
                if events.send(Event::Frame { id, kind, body }).is_err() {
                    return;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break Close::Eof,
            Err(e) if e.kind() == io::ErrorKind::InvalidData => break Close::Protocol(e.to_string()),
            Err(e) => break Close::Io(e.to_string()),
        }
    };
    let _ = events.send(Event::Closed { id, why });
}

/// Where one PE stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pe {
    /// Not connected yet.
    Absent,
    /// Said hello on this connection.
    Joined(u64),
    /// Said [`wire::RUN`] on this connection: sends and receives messages.
    Running(u64),
    /// Said goodbye, disconnected, or exited.
    Left,
}

impl Pe {
    /// The connection of a PE that is connected.
    fn conn(self) -> Option<u64> {
        match self {
            Pe::Joined(id) | Pe::Running(id) => Some(id),
            Pe::Absent | Pe::Left => None,
        }
    }
}

/// An open connection.
struct Conn {
    stream: Arc<TcpStream>,
    rank: Option<usize>,
    /// Run-phase bytes that the socket buffer did not take yet.
    backlog: Backlog,
}

/// A PE whose connection closed without goodbye in the run phase, whose
/// news waits for its exit status.
struct Dying {
    rank: usize,
    /// What happened to the connection.
    how: String,
    /// When to announce it without the status.
    until: Instant,
}

/// The server's state, owned by one thread that handles events in order.
struct Coordinator {
    shared: Arc<Shared>,
    token: Token,
    conns: HashMap<u64, Conn>,
    pes: Vec<Pe>,
    joined: usize,
    /// Every PE has connected (and been told so).
    ready: bool,
    /// Current allgather round, from 0.
    round: u64,
    contributions: Vec<Option<Vec<u8>>>,
    /// Set once the job's bootstrap cannot succeed any more.
    failed: Option<String>,
    /// Connections a send failed on, to be closed after the current event.
    dead: Vec<(u64, String)>,
    /// A PE has said [`wire::RUN`]: the init phase is over.
    running: bool,
    /// Exit statuses the launcher reported, by rank.
    exits: Vec<Option<ExitStatus>>,
    /// Deaths not announced yet.
    dying: Vec<Dying>,
}

impl Coordinator {
    fn new(n: usize, token: Token, shared: Arc<Shared>) -> Coordinator {
        Coordinator {
            shared,
            token,
            conns: HashMap::new(),
            pes: vec![Pe::Absent; n],
            joined: 0,
            ready: false,
            round: 0,
            contributions: vec![None; n],
            failed: None,
            dead: Vec::new(),
            running: false,
            exits: vec![None; n],
            dying: Vec::new(),
        }
    }

    fn run(mut self, inbox: Receiver<Event>) {
        loop {
            let event = match self.next_wakeup() {
                None => inbox.recv().map_err(|_| RecvTimeoutError::Disconnected),
                Some(at) => inbox.recv_timeout(at.saturating_duration_since(Instant::now())),
            };
            match event {
                Ok(Event::Stop) | Err(RecvTimeoutError::Disconnected) => break,
                Ok(Event::Opened { id, stream }) => {
                    self.conns.insert(id, Conn { stream, rank: None, backlog: Backlog::default() });
                }
                Ok(Event::Frame { id, kind, body }) => self.on_frame(id, kind, body),
                Ok(Event::Closed { id, why }) => self.on_closed(id, why),
                Ok(Event::Exited { rank, status }) => self.on_exited(rank, status),
                Err(RecvTimeoutError::Timeout) => {}
            }
            self.flush_backlogs();
            self.announce_due_deaths();
            while let Some((id, why)) = self.dead.pop() {
                if self.running && why.starts_with(backlog::SEND_FAILED) {
                    // The connection is broken: its reader reports its end,
                    // after the goodbye the PE may have sent before it
                    // closed (a PE that left is not dead).
                    if let Some(conn) = self.conns.get_mut(&id) {
                        conn.backlog = Backlog::default();
                    }
                    continue;
                }
                self.on_closed(id, Close::Io(why));
            }
            if self.pes.iter().all(|&pe| pe == Pe::Left) {
                break;
            }
        }
        self.shared.stop();
    }

    /// When the coordinator has something to do without an event: retry a
    /// backlog, or announce a death whose exit status did not come.
    fn next_wakeup(&self) -> Option<Instant> {
        let deaths = self.dying.iter().map(|d| d.until).min();
        let retry = self.conns.values().any(|c| !c.backlog.is_empty()).then(|| Instant::now() + BACKLOG_RETRY);
        deaths.into_iter().chain(retry).min()
    }

    fn on_frame(&mut self, id: u64, kind: u8, body: Vec<u8>) {
        let Some(conn) = self.conns.get(&id) else {
            return; // closed by us meanwhile
        };
        match (kind, conn.rank) {
            (wire::HELLO, None) => self.on_hello(id, &body),
            (wire::GATHER, Some(rank)) if self.ready => self.on_gather(id, rank, body),
            (wire::BYE, Some(rank)) => self.on_bye(rank),
            (wire::RUN, Some(rank)) if self.ready && self.pes[rank] == Pe::Joined(id) => self.on_run(id, rank),
            (wire::SEND, Some(rank)) if self.pes[rank] == Pe::Running(id) => self.on_send(id, rank, body),
            (wire::QUERY, _) => {
                let status = self.status();
                self.send(id, wire::STATUS, &status);
            }
            _ => self.reject(id, format!("protocol error: unexpected message kind {kind}")),
        }
    }

    fn on_hello(&mut self, id: u64, body: &[u8]) {
        let n = self.pes.len();
        let Some((rank, size, token)) = wire::parse_hello(body) else {
            return self.reject(id, "protocol error: not a shmem bootstrap hello".into());
        };
        if token != self.token {
            return self.reject(
                id,
                format!("a process claiming PE {rank} presented a wrong {} (not this job's)", env::RENDEZVOUS_TOKEN),
            );
        }
        if size != n {
            return self.reject(id, format!("PE {rank} was started for a world of {size} PEs, but this job has {n}"));
        }
        if rank >= n {
            return self.reject(id, format!("rank {rank} is out of range for a world of {n} PEs"));
        }
        if self.pes[rank] != Pe::Absent {
            return self
                .reject(id, format!("PE {rank} connected twice (another process already has SHMEM_RANK={rank})"));
        }
        if let Some(msg) = self.failed.clone() {
            self.pes[rank] = Pe::Left;
            return self.reject(id, msg);
        }
        self.pes[rank] = Pe::Joined(id);
        if let Some(conn) = self.conns.get_mut(&id) {
            conn.rank = Some(rank);
        }
        self.joined += 1;
        if self.joined == n {
            self.ready = true;
            for id in self.joined_conns() {
                self.send(id, wire::READY, &[]);
            }
        }
    }

    fn on_gather(&mut self, id: u64, rank: usize, body: Vec<u8>) {
        if let Some(msg) = self.failed.clone() {
            return self.send(id, wire::ERROR, msg.as_bytes());
        }
        if self.contributions[rank].is_some() {
            return self.reject(id, "protocol error: two contributions to one allgather".into());
        }
        if let Some(runner) = self.pes.iter().position(|pe| matches!(pe, Pe::Running(_))) {
            let msg = format!(
                "PE {runner} ended its init before allgather #{}, so the PEs called allgather a \
                 different number of times",
                self.round + 1
            );
            return self.send(id, wire::ERROR, msg.as_bytes());
        }
        if let Some(gone) = self.pes.iter().position(|&pe| pe == Pe::Left) {
            // Without a failure, a PE that left said goodbye.
            let msg = format!(
                "PE {gone} said goodbye before allgather #{}, so the PEs called allgather a \
                 different number of times",
                self.round + 1
            );
            return self.send(id, wire::ERROR, msg.as_bytes());
        }
        self.contributions[rank] = Some(body);
        if self.contributions.iter().all(Option::is_some) {
            let parts: Vec<Vec<u8>> = self.contributions.iter_mut().map(|c| c.take().unwrap_or_default()).collect();
            let body_len: usize = parts.iter().map(|p| 8 + p.len()).sum();
            let mut frame = Vec::with_capacity(wire::HEADER_LEN + body_len);
            frame.push(wire::RESULT);
            frame.extend_from_slice(&(body_len as u64).to_le_bytes());
            for part in &parts {
                frame.extend_from_slice(&(part.len() as u64).to_le_bytes());
                frame.extend_from_slice(part);
            }
            drop(parts);
            self.round += 1;
            for id in self.joined_conns() {
                self.send_frame(id, &frame);
            }
        }
    }

    fn on_bye(&mut self, rank: usize) {
        self.pes[rank] = Pe::Left;
        if self.failed.is_some() {
            return;
        }
        if self.running {
            return self.announce_end(rank, false, &left_text(rank));
        }
        if !self.ready {
            let msg = format!("PE {rank} gave up waiting; {} had not connected yet", wire::list_pes(&self.absent()));
            self.fail(msg);
        } else if self.contributions[rank].is_some() {
            let msg = format!(
                "PE {rank} gave up during allgather #{}, which was still waiting for {}",
                self.round + 1,
                wire::list_pes(&self.missing_contributions())
            );
            self.fail(msg);
        } else if self.contributions.iter().any(Option::is_some) {
            let msg = format!(
                "PE {rank} said goodbye without joining allgather #{}, so the PEs called \
                 allgather a different number of times",
                self.round + 1
            );
            self.fail(msg);
        }
    }

    /// A PE is done with `init` and keeps its connection for messages.
    fn on_run(&mut self, id: u64, rank: usize) {
        if self.failed.is_some() {
            return; // it has been sent the failure already
        }
        if self.contributions.iter().any(Option::is_some) {
            let msg = format!(
                "PE {rank} ended its init during allgather #{}, so the PEs called allgather a \
                 different number of times",
                self.round + 1
            );
            return self.fail(msg);
        }
        self.pes[rank] = Pe::Running(id);
        if !self.running {
            self.running = true;
            // Those that said goodbye in the init phase were not announced.
            let left: Vec<usize> = (0..self.pes.len()).filter(|&r| self.pes[r] == Pe::Left).collect();
            for gone in left {
                self.announce_end(gone, false, &left_text(gone));
            }
        }
    }

    /// Forwards a message; drops it if its destination has ended.
    fn on_send(&mut self, id: u64, rank: usize, mut body: Vec<u8>) {
        let n = self.pes.len();
        let Some((to, _)) = wire::parse_addressed(&body) else {
            return self.reject(id, "protocol error: a message without a destination".into());
        };
        if to >= n {
            return self.reject(id, format!("protocol error: a message to PE {to}, in a world of {n} PEs"));
        }
        let Some(dest) = self.pes[to].conn() else {
            return; // it ended, and the sender is told so by a GONE
        };
        body[..4].copy_from_slice(&(rank as u32).to_le_bytes());
        self.post(dest, &wire::frame(wire::DELIVER, &body));
    }

    fn on_closed(&mut self, id: u64, why: Close) {
        let Some(conn) = self.conns.remove(&id) else {
            return;
        };
        let _ = conn.stream.shutdown(Shutdown::Both);
        let Some(rank) = conn.rank else {
            return;
        };
        if self.pes[rank].conn() != Some(id) {
            return; // said goodbye before
        }
        self.pes[rank] = Pe::Left;
        if self.failed.is_some() {
            return;
        }
        if self.running {
            let how = match why {
                Close::Eof => "its connection to the launcher closed".to_string(),
                Close::Io(e) => format!("its connection to the launcher failed: {e}"),
                Close::Protocol(e) => format!("the launcher closed its connection: {e}"),
            };
            return match self.exits[rank] {
                Some(status) => self.announce_end(rank, true, &died_text(rank, &how, Some(status))),
                None => self.dying.push(Dying { rank, how, until: Instant::now() + EXIT_STATUS_WAIT }),
            };
        }
        let how = match why {
            Close::Eof => "its connection closed without goodbye".to_string(),
            Close::Io(e) => format!("connection error: {e}"),
            Close::Protocol(e) => format!("protocol error: {e}"),
        };
        let context = if !self.ready {
            format!("; {} had not connected yet", wire::list_pes(&self.absent()))
        } else if self.contributions.iter().any(Option::is_some) {
            let missing: Vec<usize> = self.missing_contributions().into_iter().filter(|&r| r != rank).collect();
            if missing.is_empty() {
                String::new()
            } else {
                format!("; allgather #{} was still waiting for {}", self.round + 1, wire::list_pes(&missing))
            }
        } else {
            String::new()
        };
        self.fail(format!("PE {rank} left during bootstrap ({how}){context}"));
    }

    fn on_exited(&mut self, rank: usize, status: ExitStatus) {
        if let Some(exit) = self.exits.get_mut(rank) {
            *exit = Some(status);
        }
        if let Some(i) = self.dying.iter().position(|d| d.rank == rank) {
            let d = self.dying.remove(i);
            self.announce_end(rank, true, &died_text(rank, &d.how, Some(status)));
        }
        // A PE that connected is followed through its connection instead:
        // its goodbye may still be on the way.
        if self.pes.get(rank) != Some(&Pe::Absent) {
            return;
        }
        self.pes[rank] = Pe::Left;
        if self.failed.is_none() {
            self.fail(format!("PE {rank} {} before connecting to the rendezvous", describe_status(status)));
        }
    }

    /// Announces the deaths whose exit status did not come in time.
    fn announce_due_deaths(&mut self) {
        let now = Instant::now();
        while let Some(i) = self.dying.iter().position(|d| d.until <= now) {
            let d = self.dying.remove(i);
            self.announce_end(d.rank, true, &died_text(d.rank, &d.how, None));
        }
    }

    /// Tells every PE still connected that PE `rank` has ended.
    fn announce_end(&mut self, rank: usize, died: bool, text: &str) {
        let frame = wire::frame(wire::GONE, &wire::gone(rank as u32, died, text));
        for id in self.joined_conns() {
            self.post(id, &frame);
        }
    }

    /// Ends the bootstrap for every connected PE with `msg`.
    fn fail(&mut self, msg: String) {
        for id in self.joined_conns() {
            self.send(id, wire::ERROR, msg.as_bytes());
            if let Some(conn) = self.conns.get(&id) {
                let _ = conn.stream.shutdown(Shutdown::Both);
            }
        }
        self.failed = Some(msg);
    }

    /// Tells a connection what is wrong and closes it.
    fn reject(&mut self, id: u64, msg: String) {
        self.send(id, wire::ERROR, msg.as_bytes());
        self.on_closed(id, Close::Protocol(msg));
    }

    /// The phase, round and missing PEs, for a [`wire::QUERY`].
    fn status(&self) -> Vec<u8> {
        if self.running {
            wire::status(wire::PHASE_RUN, self.round, &[])
        } else if self.ready {
            wire::status(wire::PHASE_GATHER, self.round, &self.missing_contributions())
        } else {
            wire::status(wire::PHASE_CONNECT, 0, &self.absent())
        }
    }

    fn absent(&self) -> Vec<usize> {
        (0..self.pes.len()).filter(|&r| self.pes[r] == Pe::Absent).collect()
    }

    fn missing_contributions(&self) -> Vec<usize> {
        (0..self.pes.len()).filter(|&r| self.contributions[r].is_none()).collect()
    }

    /// Connections of PEs that said hello and have not left, by rank.
    fn joined_conns(&self) -> Vec<u64> {
        self.pes.iter().filter_map(|pe| pe.conn()).collect()
    }

    fn send(&mut self, id: u64, kind: u8, body: &[u8]) {
        self.send_frame(id, &wire::frame(kind, body));
    }

    /// Sends an init-phase frame, blocking up to [`SERVER_WRITE_TIMEOUT`]
    /// (behind a run-phase backlog, if there is one).
    fn send_frame(&mut self, id: u64, frame: &[u8]) {
        if let Some(conn) = self.conns.get_mut(&id) {
            if !conn.backlog.is_empty() {
                return self.post(id, frame);
            }
            if let Err(e) = (&*conn.stream).write_all(frame) {
                self.dead.push((id, format!("cannot send to it: {e}")));
            }
        }
    }

    /// Sends a run-phase frame without blocking; what the socket does not
    /// take now waits in the connection's backlog.
    fn post(&mut self, id: u64, frame: &[u8]) {
        if let Some(conn) = self.conns.get_mut(&id) {
            conn.backlog.push(frame);
            if let Err(why) = conn.backlog.flush(&conn.stream) {
                self.dead.push((id, why));
            }
        }
    }

    /// Retries every backlog.
    fn flush_backlogs(&mut self) {
        for (&id, conn) in self.conns.iter_mut().filter(|(_, c)| !c.backlog.is_empty()) {
            if let Err(why) = conn.backlog.flush(&conn.stream) {
                self.dead.push((id, why));
            }
        }
    }
}

/// The [`wire::GONE`] text of a PE that said goodbye.
fn left_text(rank: usize) -> String {
    format!("PE {rank} left (it said goodbye to the launcher)")
}

/// The [`wire::GONE`] text of a PE whose connection ended without goodbye:
/// "PE 3 died (its connection to the launcher closed; it was killed by
/// signal 9 (SIGKILL))".
fn died_text(rank: usize, how: &str, status: Option<ExitStatus>) -> String {
    match status {
        Some(status) => format!("PE {rank} died ({how}; it {})", describe_status(status)),
        None => format!("PE {rank} died ({how})"),
    }
}

/// Locks a mutex, ignoring poisoning (the registry stays consistent: every
/// critical section is a push or a flag update).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests;
