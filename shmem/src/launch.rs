//! Starting the PEs of a job on this machine: the library behind `shmemrun`.
//!
//! [`Launch`] starts a rendezvous server on `127.0.0.1`, spawns one process
//! per PE with the launcher's variables (`SHMEM_RANK`, `SHMEM_WORLD_SIZE`,
//! `SHMEM_LOCAL_RANK`, `SHMEM_LOCAL_SIZE`, `SHMEM_RENDEZVOUS`,
//! `SHMEM_RENDEZVOUS_TOKEN`) set, and waits for all of them. The server
//! listens on loopback only and turns away a connection that does not
//! present the job's random token. When a PE fails, the others are stopped (SIGTERM,
//! then SIGKILL after a grace period) unless told otherwise.
//!
//! A program that should also run on its own hands its body to
//! [`spmd_main`]: under a launcher the body runs as this PE; run directly,
//! the program starts a job of itself.
//!
//! ```no_run
//! fn main() -> std::process::ExitCode {
//!     shmem::launch::spmd_main("hello", 2, || -> shmem::Result<()> {
//!         let ctx = shmem::init()?;
//!         println!("PE {} of {}", ctx.my_pe(), ctx.n_pes());
//!         Ok(())
//!     })
//! }
//! ```
//!
//! Test binaries that want more control re-launch themselves with [`Launch`]:
//!
//! ```no_run
//! use shmem::launch::Launch;
//!
//! let exe = std::env::current_exe().unwrap();
//! let outcome = Launch::new(4, exe).args(["--as-pe"]).tag_output(true).run().unwrap();
//! if !outcome.success() {
//!     eprintln!("launch: {outcome}");
//! }
//! std::process::exit(outcome.exit_code());
//! ```
//!
//! Each PE runs in its own process group, so that stopping a PE also stops
//! whatever it started (a shell's children, say). Such PEs do not see the
//! terminal's Ctrl-C; [`Launch::forward_signals`] passes SIGINT, SIGTERM and
//! SIGHUP on to them. On Linux a PE is also killed if the launcher dies.

use crate::bootstrap::env;
use crate::bootstrap::tcp::{wire, Token};
use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::io::{self, BufRead, BufReader, IsTerminal, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// The `main` of an SPMD program that also runs on its own (the examples,
/// a quick test). Started by a launcher (`shmemrun`, `mpirun`, `srun`: see
/// [`crate::bootstrap::started_by_launcher`]), it runs `body` as this PE
/// and, if `body` fails, prints `name failed: <error>` and returns 1.
/// Started directly, it runs `pes` PEs of this same program with the same
/// arguments (each output line tagged with its PE; the job stopped at the
/// first failure), says which PE failed if one did, and returns the job's
/// exit code (see [`Outcome::exit_code`], saturated to 255).
pub fn spmd_main<E: fmt::Display>(name: &str, pes: usize, body: impl FnOnce() -> Result<(), E>) -> ExitCode {
    if crate::bootstrap::started_by_launcher() {
        return match body() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("{name} failed: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let job = std::env::current_exe()
        .map(|exe| Launch::new(pes, exe).args(std::env::args_os().skip(1)).tag_output(true).kill_on_failure(true));
    match job.and_then(|j| j.run()) {
        Ok(outcome) => outcome.report(name),
        Err(e) => {
            eprintln!("{name}: starting {pes} PEs of this program failed: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Default time between SIGTERM and SIGKILL when stopping the survivors.
const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(2);
/// How long output forwarding may go on after the last PE exited (a PE's
/// orphaned child may hold its pipe open).
const OUTPUT_DRAIN: Duration = Duration::from_secs(1);
/// How long the first failure waits for a PE whose main thread has ended
/// to end (see `likely_cause`).
const DYING_WAIT: Duration = Duration::from_secs(2);
/// How often the wait loop looks for signals to forward.
const SIGNAL_POLL: Duration = Duration::from_millis(50);

/// A job to start: `n_pes` copies of one program on this machine.
///
/// Built with [`Launch::new`] and the chainable setters, started with
/// [`Launch::run`].
#[derive(Debug, Clone)]
pub struct Launch {
    n_pes: usize,
    program: OsString,
    args: Vec<OsString>,
    envs: Vec<(OsString, OsString)>,
    tag_output: bool,
    kill_on_failure: bool,
    kill_grace: Duration,
    forward_signals: bool,
    /// Tests collect tagged output here instead of our stdout/stderr.
    #[cfg(test)]
    capture: Option<Arc<Mutex<Vec<u8>>>>,
}

impl Launch {
    /// A job of `n_pes` processes of `program` (looked up in `PATH` like
    /// [`std::process::Command::new`]).
    pub fn new(n_pes: usize, program: impl AsRef<OsStr>) -> Launch {
        Launch {
            n_pes,
            program: program.as_ref().to_owned(),
            args: Vec::new(),
            envs: Vec::new(),
            tag_output: false,
            kill_on_failure: true,
            kill_grace: DEFAULT_KILL_GRACE,
            forward_signals: false,
            #[cfg(test)]
            capture: None,
        }
    }

    /// Adds one argument for every PE.
    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Launch {
        self.args.push(arg.as_ref().to_owned());
        self
    }

    /// Adds arguments for every PE.
    pub fn args<I, S>(mut self, args: I) -> Launch
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args.extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// Sets an environment variable for every PE. The launcher's own
    /// `SHMEM_*` variables take precedence.
    pub fn env(mut self, key: impl AsRef<OsStr>, val: impl AsRef<OsStr>) -> Launch {
        self.envs.push((key.as_ref().to_owned(), val.as_ref().to_owned()));
        self
    }

    /// Prefixes every line a PE writes to stdout or stderr with `[rank] `
    /// (default: off, the PEs write straight to our stdout and stderr).
    pub fn tag_output(mut self, on: bool) -> Launch {
        self.tag_output = on;
        self
    }

    /// Whether the first failing PE makes the launcher stop all the others
    /// (default: on).
    pub fn kill_on_failure(mut self, on: bool) -> Launch {
        self.kill_on_failure = on;
        self
    }

    /// Time between SIGTERM and SIGKILL when stopping the survivors
    /// (default: 2 s; `Duration::MAX`: never SIGKILL).
    pub fn kill_grace(mut self, grace: Duration) -> Launch {
        self.kill_grace = grace;
        self
    }

    /// While [`Launch::run`] waits, catch SIGINT, SIGTERM and SIGHUP and
    /// pass them on to every PE; a second one kills the PEs outright
    /// (default: off). Meant for launcher programs such as `shmemrun`: the
    /// previous handlers are restored when `run` returns.
    pub fn forward_signals(mut self, on: bool) -> Launch {
        self.forward_signals = on;
        self
    }

    /// Starts the job and waits until every PE has exited.
    ///
    /// Fails only if the job cannot be started (no PEs, the program cannot
    /// be spawned, the rendezvous cannot listen); a PE that fails is
    /// reported in the [`Outcome`]. Any PE already started is stopped and
    /// reaped before an error is returned.
    pub fn run(&self) -> io::Result<Outcome> {
        if self.n_pes == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "a job needs at least one PE"));
        }
        let server = RendezvousServer::start(self.n_pes)?;
        let mut signals = if self.forward_signals { Some(SignalForwarding::install()?) } else { None };
        let (out_tx, out_rx) = mpsc::channel();
        let mut children = Vec::with_capacity(self.n_pes);
        let spawned = self.spawn_all(server.addr(), server.token(), &mut children, &out_tx);
        drop(out_tx);
        // (A second early: file times come from the kernel's coarse clock,
        // which lags the one SystemTime reads.)
        let started = std::time::SystemTime::now() - Duration::from_secs(1);
        let result = spawned.and_then(|()| self.wait_all(&mut children, &server, signals.as_mut()));
        if result.is_err() {
            kill_and_reap(&mut children);
        }
        // A PE 0 that died between creating the host backend's shared
        // object and every PE mapping it (when any PE unlinks it) left it
        // in /dev/shm: its name starts with PE 0's pid.
        if !result.as_ref().is_ok_and(Outcome::success) {
            if let Some(pe0) = children.first() {
                remove_host_heap_leftovers(pe0.id(), started);
            }
        }
        drop(signals);
        server.shutdown();
        // Let forwarded output catch up, so that it comes before whatever
        // the caller prints next; give up on pipes that a PE's orphaned
        // children keep open (their threads end when the pipes close).
        let drain_until = Instant::now() + OUTPUT_DRAIN;
        while let Some(left) = drain_until.checked_duration_since(Instant::now()) {
            if out_rx.recv_timeout(left).is_err() {
                break;
            }
        }
        result
    }

    /// Spawns every PE (and, with tagged output, its forwarding threads),
    /// pushing each child onto `children` as soon as it exists.
    fn spawn_all(
        &self,
        addr: SocketAddr,
        token: Token,
        children: &mut Vec<Child>,
        out_done: &Sender<()>,
    ) -> io::Result<()> {
        // A PE in its own process group that reads the terminal would be
        // stopped, so PEs get the terminal's stdin never; piped or
        // redirected stdin goes to PE 0 (as with mpirun).
        let stdin_is_tty = io::stdin().is_terminal();
        for rank in 0..self.n_pes {
            let mut cmd = Command::new(&self.program);
            cmd.args(&self.args)
                .envs(self.envs.iter().map(|(k, v)| (k, v)))
                .env(env::RANK, rank.to_string())
                .env(env::WORLD_SIZE, self.n_pes.to_string())
                .env(env::LOCAL_RANK, rank.to_string())
                .env(env::LOCAL_SIZE, self.n_pes.to_string())
                .env(env::RENDEZVOUS, addr.to_string())
                .env(env::RENDEZVOUS_TOKEN, token.to_hex())
                .process_group(0)
                .stdin(if rank == 0 && !stdin_is_tty { Stdio::inherit() } else { Stdio::null() });
            if self.tag_output {
                cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
            }
            die_with_parent(&mut cmd);
            let mut child = cmd
                .spawn()
                .map_err(|e| io::Error::new(e.kind(), format!("cannot start {:?} for PE {rank}: {e}", self.program)))?;
            let pipes = (child.stdout.take(), child.stderr.take());
            children.push(child);
            if let (Some(stdout), Some(stderr)) = pipes {
                self.forward_output(rank, stdout, Sink::Stdout, out_done)?;
                self.forward_output(rank, stderr, Sink::Stderr, out_done)?;
            }
        }
        Ok(())
    }

    /// Starts a thread that copies `from` line by line, tagged with `rank`.
    fn forward_output(
        &self,
        rank: usize,
        from: impl Read + Send + 'static,
        sink: Sink,
        done: &Sender<()>,
    ) -> io::Result<()> {
        #[cfg(test)]
        let sink = match &self.capture {
            Some(buf) => Sink::Buffer(buf.clone()),
            None => sink,
        };
        let done = done.clone();
        thread::Builder::new()
            .name(format!("shmem-output-{rank}"))
            .spawn(move || {
                forward_lines(rank, from, &sink);
                let _ = done.send(());
            })
            .map(drop)
    }

    /// Waits for every PE, stopping the others after the first failure.
    fn wait_all(
        &self,
        children: &mut [Child],
        server: &RendezvousServer,
        mut signals: Option<&mut SignalForwarding>,
    ) -> io::Result<Outcome> {
        let n = children.len();
        // One thread per PE waits for it to exit without reaping it; only
        // this thread reaps, so a PE is signalled only while its pid (and
        // process group id) cannot have been reused.
        let (exit_tx, exit_rx) = mpsc::channel();
        for (rank, child) in children.iter().enumerate() {
            let pid = child.id();
            let tx = exit_tx.clone();
            thread::Builder::new().name(format!("shmem-wait-{rank}")).spawn(move || {
                let _ = wait_exit_nowait(pid);
                let _ = tx.send(rank);
            })?;
        }
        drop(exit_tx);

        let mut statuses: Vec<Option<ExitStatus>> = vec![None; n];
        let mut first_failure = None;
        let mut live = n;
        let mut kill_at: Option<Instant> = None;
        while live > 0 {
            let now = Instant::now();
            let mut wait = kill_at.map(|at| at.saturating_duration_since(now));
            if signals.is_some() {
                wait = Some(wait.map_or(SIGNAL_POLL, |w| w.min(SIGNAL_POLL)));
            }
            let exited = match wait {
                Some(w) => exit_rx.recv_timeout(w),
                None => exit_rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            };
            match exited {
                Ok(rank) => {
                    let status = children[rank].wait()?;
                    statuses[rank] = Some(status);
                    live -= 1;
                    server.pe_exited(rank, status);
                    // Only the first failure counts: later ones are often
                    // our own SIGTERM/SIGKILL or a consequence of the first.
                    if !status.success() && first_failure.is_none() {
                        first_failure = Some(likely_cause(children, &statuses, rank, status));
                        if self.kill_on_failure && live > 0 {
                            signal_live(children, &statuses, libc::SIGTERM);
                            // A grace too long for the clock means never.
                            kill_at = Instant::now().checked_add(self.kill_grace);
                        }
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    // A waiting thread died; reap the rest directly.
                    for (rank, child) in children.iter_mut().enumerate() {
                        if statuses[rank].is_none() {
                            let status = child.wait()?;
                            statuses[rank] = Some(status);
                            if !status.success() && first_failure.is_none() {
                                first_failure = Some((rank, status));
                            }
                        }
                    }
                    break;
                }
            }
            if kill_at.is_some_and(|at| Instant::now() >= at) {
                signal_live(children, &statuses, libc::SIGKILL);
                kill_at = None;
            }
            if let Some(signals) = signals.as_deref_mut() {
                for sig in signals.take_pending() {
                    signal_live(children, &statuses, sig);
                }
            }
        }
        Ok(Outcome {
            statuses: statuses.into_iter().map(|s| s.expect("every PE was reaped")).collect(),
            pids: children.iter().map(Child::id).collect(),
            first_failure,
        })
    }
}

/// How a job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Every PE's exit status, by rank.
    pub statuses: Vec<ExitStatus>,
    /// Every PE's process id, by rank (all reaped by now): what names a
    /// job's leftovers, such as the host backend's `/dev/shm/shmem-<pid of
    /// PE 0>-…` object.
    pub pids: Vec<u32>,
    /// The first PE seen to fail (non-zero exit code, or killed by a
    /// signal), in time order, and its status.
    pub first_failure: Option<(usize, ExitStatus)>,
}

impl Outcome {
    /// What a launcher program ends with: says which PE failed, if one did
    /// (`who: PE 1 exited with status 3`, on stderr), and returns
    /// [`Outcome::exit_code`] as the process's exit code.
    pub fn report(&self, who: &str) -> ExitCode {
        if !self.success() {
            eprintln!("{who}: {self}");
        }
        // Codes above 255 cannot happen on Unix; clamp anyway.
        ExitCode::from(self.exit_code().clamp(0, 255) as u8)
    }

    /// Whether every PE exited with status 0.
    pub fn success(&self) -> bool {
        self.first_failure.is_none()
    }

    /// The job's exit code, shell style: 0 if every PE succeeded, else the
    /// first failing PE's exit code, or 128 + signal if a signal killed it.
    pub fn exit_code(&self) -> i32 {
        match self.first_failure {
            None => 0,
            Some((_, status)) => match (status.code(), status.signal()) {
                (Some(code), _) => code,
                (None, Some(sig)) => 128 + sig,
                (None, None) => 1,
            },
        }
    }
}

/// One line: "PE 2 exited with status 3", or "all 4 PEs exited
/// successfully".
impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.first_failure {
            Some((rank, status)) => write!(f, "PE {rank} {}", describe_status(status)),
            None if self.statuses.len() == 1 => f.write_str("the PE exited successfully"),
            None => write!(f, "all {} PEs exited successfully", self.statuses.len()),
        }
    }
}

/// Words an exit status: "exited with status 3", "was killed by signal 9
/// (SIGKILL)".
pub fn describe_status(status: ExitStatus) -> String {
    if let Some(code) = status.code() {
        return format!("exited with status {code}");
    }
    if let Some(sig) = status.signal() {
        let core = if status.core_dumped() { ", core dumped" } else { "" };
        return match signal_name(sig) {
            Some(name) => format!("was killed by signal {sig} ({name}{core})"),
            None if core.is_empty() => format!("was killed by signal {sig}"),
            None => format!("was killed by signal {sig} (core dumped)"),
        };
    }
    format!("ended with {status}")
}

/// The usual name of a common signal.
fn signal_name(sig: i32) -> Option<&'static str> {
    Some(match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        _ => return None,
    })
}

/// Makes the child die with the launcher (Linux), so that PEs do not
/// outlive a launcher killed by SIGKILL.
fn die_with_parent(cmd: &mut Command) {
    #[cfg(target_os = "linux")]
    {
        let parent = std::process::id();
        let hook = move || {
            // SAFETY: prctl(PR_SET_PDEATHSIG) takes integers only and is
            // async-signal-safe.
            if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) } != 0 {
                return Err(io::Error::last_os_error());
            }
            // The launcher may have died before prctl took effect.
            // SAFETY: getppid has no preconditions.
            if unsafe { libc::getppid() } as u32 != parent {
                // SAFETY: _exit ends the forked child at once; nothing of
                // the parent's state is touched.
                unsafe { libc::_exit(1) };
            }
            Ok(())
        };
        // SAFETY: the hook runs in the forked child before exec and only
        // makes async-signal-safe calls (prctl, getppid, _exit), allocating
        // nothing.
        unsafe {
            cmd.pre_exec(hook);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = cmd;
}

/// Removes the host heap objects (`/dev/shm/shmem-<pe0>-<hex>`) of this
/// user made since `since`: what a PE 0 with process id `pe0` that died
/// during start-up leaves. The age and owner checks keep an unrelated
/// job's object safe should the pid have been reused. A PE 0 started
/// through a wrapper (such as compute-sanitizer) has another pid, and its
/// leftover stays.
fn remove_host_heap_leftovers(pe0: u32, since: std::time::SystemTime) {
    use std::os::unix::fs::MetadataExt;
    let Ok(dir) = std::fs::read_dir("/dev/shm") else { return };
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    for entry in dir.flatten() {
        if !entry.file_name().to_str().is_some_and(|f| crate::host::shm::is_object_of(f, pe0)) {
            continue;
        }
        let Ok(meta) = entry.metadata() else { continue };
        if meta.uid() == me && meta.modified().is_ok_and(|m| m >= since) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Blocks until child `pid` has exited, leaving it unreaped.
fn wait_exit_nowait(pid: u32) -> io::Result<()> {
    loop {
        // SAFETY: siginfo_t is plain data for which all-zero is valid;
        // waitid only writes into it.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `info` is a valid, exclusively borrowed siginfo_t.
        // WNOWAIT leaves the child for Child::wait to reap.
        let r = unsafe { libc::waitid(libc::P_PID, pid as libc::id_t, &mut info, libc::WEXITED | libc::WNOWAIT) };
        if r == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// The failure to report first when PE `rank` is the first seen failing,
/// with `status`. PEs fail because a peer died, milliseconds after it, and
/// which exit this thread hears of first is down to scheduling; so when
/// `rank` exited with a code (what a program does after an error it saw), a
/// PE that ended by a signal (a crash, a kill, the OOM killer: the launcher
/// has sent none yet) is taken as the cause instead. Such a PE looks dead
/// to its peers as soon as its main thread has ended, but can be waited for
/// only once all its threads have: one still dying is waited for, up to
/// [`DYING_WAIT`].
fn likely_cause(
    children: &[Child],
    statuses: &[Option<ExitStatus>],
    rank: usize,
    status: ExitStatus,
) -> (usize, ExitStatus) {
    if status.signal().is_some() {
        return (rank, status);
    }
    let until = Instant::now() + DYING_WAIT;
    loop {
        let mut dying = false;
        for (r, child) in children.iter().enumerate().filter(|&(r, _)| statuses[r].is_none()) {
            match exit_status_nowait(child.id()) {
                Some(s) if s.signal().is_some() => return (r, s),
                Some(_) => {}
                None => dying |= crate::host::proc_state(child.id() as libc::pid_t) == Some('Z'),
            }
        }
        if !dying || Instant::now() >= until {
            return (rank, status);
        }
        thread::sleep(Duration::from_millis(2));
    }
}

/// Child `pid`'s exit status if it has ended, leaving it unreaped.
fn exit_status_nowait(pid: u32) -> Option<ExitStatus> {
    // SAFETY: siginfo_t is plain data for which all-zero is valid.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: `info` is a valid, exclusively borrowed siginfo_t; WNOHANG
    // returns at once, WNOWAIT leaves the child for Child::wait to reap.
    let r = unsafe {
        libc::waitid(libc::P_PID, pid as libc::id_t, &mut info, libc::WEXITED | libc::WNOHANG | libc::WNOWAIT)
    };
    if r != 0 {
        return None;
    }
    // SAFETY: waitid succeeded, so `info` holds SIGCHLD information (all
    // zero while the child runs), whose fields are si_pid and si_status.
    let (who, code) = unsafe { (info.si_pid(), info.si_status()) };
    if who == 0 {
        return None;
    }
    // Back to a wait(2) status word.
    match info.si_code {
        libc::CLD_EXITED => Some(ExitStatus::from_raw((code & 0xff) << 8)),
        libc::CLD_KILLED => Some(ExitStatus::from_raw(code & 0x7f)),
        libc::CLD_DUMPED => Some(ExitStatus::from_raw(code & 0x7f | 0x80)),
        _ => None,
    }
}

/// Sends `sig` to the process group of every PE not yet reaped (an
/// unreaped PE keeps its pid, and so its group id, from being reused).
fn signal_live(children: &[Child], statuses: &[Option<ExitStatus>], sig: libc::c_int) {
    for (child, status) in children.iter().zip(statuses) {
        if status.is_none() {
            let pid = child.id() as libc::pid_t;
            // SAFETY: kill has no memory-safety preconditions; the pid is
            // our unreaped child, which also leads its own process group.
            // The PE itself is signalled too in case it left its group.
            unsafe {
                libc::kill(-pid, sig);
                libc::kill(pid, sig);
            }
        }
    }
}

/// Kills and reaps every PE still running (error path of [`Launch::run`]).
fn kill_and_reap(children: &mut [Child]) {
    for child in children.iter_mut() {
        if let Ok(None) = child.try_wait() {
            let pid = child.id() as libc::pid_t;
            // SAFETY: as in `signal_live`: an unreaped child of ours.
            unsafe {
                libc::kill(-pid, libc::SIGKILL);
                libc::kill(pid, libc::SIGKILL);
            }
            let _ = child.wait();
        }
    }
}

/// Where tagged output goes.
enum Sink {
    Stdout,
    Stderr,
    #[cfg(test)]
    Buffer(Arc<Mutex<Vec<u8>>>),
}

impl Sink {
    /// Writes one whole line, so that lines of different PEs do not mix.
    fn write_line(&self, line: &[u8]) {
        // Errors (a closed stdout) are ignored: the pipe must still be
        // drained so that the PE does not block.
        match self {
            Sink::Stdout => {
                let mut out = io::stdout().lock();
                let _ = out.write_all(line).and_then(|()| out.flush());
            }
            Sink::Stderr => {
                let _ = io::stderr().lock().write_all(line);
            }
            #[cfg(test)]
            Sink::Buffer(buf) => lock(buf).extend_from_slice(line),
        }
    }
}

/// Copies `from` to `sink` line by line, each prefixed with `[rank] `.
fn forward_lines(rank: usize, from: impl Read, sink: &Sink) {
    let prefix = format!("[{rank}] ");
    let mut reader = BufReader::new(from);
    let mut line = Vec::new();
    loop {
        line.clear();
        line.extend_from_slice(prefix.as_bytes());
        match reader.read_until(b'\n', &mut line) {
            Ok(0) => return,
            Ok(_) => {
                if !line.ends_with(b"\n") {
                    line.push(b'\n');
                }
                sink.write_line(&line);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

/// Locks a mutex, ignoring poisoning (the data stays consistent: every
/// critical section here is a single push or flag update).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

// ---------------------------------------------------------------------------
// Signal forwarding

/// The signals [`Launch::forward_signals`] passes on.
const FORWARDED: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];
/// How often each of [`FORWARDED`] arrived since the process started.
static RECEIVED: [AtomicUsize; 3] = [AtomicUsize::new(0), AtomicUsize::new(0), AtomicUsize::new(0)];
/// Runs forwarding now, and the handlers they replaced.
static INSTALLED: Mutex<(usize, Vec<(libc::c_int, libc::sigaction)>)> = Mutex::new((0, Vec::new()));

extern "C" fn note_signal(sig: libc::c_int) {
    // Only an atomic add: async-signal-safe.
    if let Some(i) = FORWARDED.iter().position(|&s| s == sig) {
        RECEIVED[i].fetch_add(1, Ordering::Relaxed);
    }
}

/// One run's share of the signal handlers; restores the old ones when the
/// last run ends.
struct SignalForwarding {
    seen: [usize; 3],
    forwarded_any: bool,
}

impl SignalForwarding {
    fn install() -> io::Result<SignalForwarding> {
        let mut installed = lock(&INSTALLED);
        if installed.0 == 0 {
            for &sig in &FORWARDED {
                // SAFETY: all-zero is a valid sigaction (no flags, and the
                // mask is emptied below).
                let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
                action.sa_sigaction = note_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
                action.sa_flags = libc::SA_RESTART;
                // SAFETY: both pointers refer to live sigaction values; the
                // handler only touches atomics.
                let old = unsafe {
                    libc::sigemptyset(&mut action.sa_mask);
                    let mut old: libc::sigaction = std::mem::zeroed();
                    if libc::sigaction(sig, &action, &mut old) != 0 {
                        return Err(io::Error::last_os_error());
                    }
                    old
                };
                installed.1.push((sig, old));
            }
        }
        installed.0 += 1;
        Ok(SignalForwarding {
            seen: std::array::from_fn(|i| RECEIVED[i].load(Ordering::Relaxed)),
            forwarded_any: false,
        })
    }

    /// The signals to send the PEs for what arrived since the last call:
    /// the first one as is, any later one as SIGKILL.
    fn take_pending(&mut self) -> Vec<libc::c_int> {
        let mut out = Vec::new();
        for (i, &sig) in FORWARDED.iter().enumerate() {
            let now = RECEIVED[i].load(Ordering::Relaxed);
            for _ in self.seen[i]..now {
                out.push(if self.forwarded_any { libc::SIGKILL } else { sig });
                self.forwarded_any = true;
            }
            self.seen[i] = now;
        }
        out
    }
}

impl Drop for SignalForwarding {
    fn drop(&mut self) {
        let mut installed = lock(&INSTALLED);
        installed.0 -= 1;
        if installed.0 == 0 {
            for (sig, old) in installed.1.drain(..) {
                // SAFETY: restores a sigaction value saved by `install`.
                unsafe { libc::sigaction(sig, &old, std::ptr::null_mut()) };
            }
        }
    }
}

// ---------------------------------------------------------------------------
// The rendezvous server (the client is `crate::bootstrap::tcp`)

/// How long the accept loop sleeps between looks at the stop flag.
const ACCEPT_POLL: Duration = Duration::from_millis(100);
/// Longest a send to one PE may block the server.
const SERVER_WRITE_TIMEOUT: Duration = Duration::from_secs(60);

/// The launcher's rendezvous server for one job of `n` PEs.
///
/// Accepts the PEs' connections, checks their hellos, tells them when all
/// have connected, then serves allgather rounds until every PE has said
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
    /// Said goodbye, disconnected, or exited.
    Left,
}

/// An open connection.
struct Conn {
    stream: Arc<TcpStream>,
    rank: Option<usize>,
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
        }
    }

    fn run(mut self, inbox: Receiver<Event>) {
        while let Ok(event) = inbox.recv() {
            match event {
                Event::Stop => break,
                Event::Opened { id, stream } => {
                    self.conns.insert(id, Conn { stream, rank: None });
                }
                Event::Frame { id, kind, body } => self.on_frame(id, kind, body),
                Event::Closed { id, why } => self.on_closed(id, why),
                Event::Exited { rank, status } => self.on_exited(rank, status),
            }
            while let Some((id, why)) = self.dead.pop() {
                self.on_closed(id, Close::Io(why));
            }
            if self.pes.iter().all(|&pe| pe == Pe::Left) {
                break;
            }
        }
        self.shared.stop();
    }

    fn on_frame(&mut self, id: u64, kind: u8, body: Vec<u8>) {
        let Some(conn) = self.conns.get(&id) else {
            return; // closed by us meanwhile
        };
        match (kind, conn.rank) {
            (wire::HELLO, None) => self.on_hello(id, &body),
            (wire::GATHER, Some(rank)) if self.ready => self.on_gather(id, rank, body),
            (wire::BYE, Some(rank)) => self.on_bye(rank),
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

    fn on_closed(&mut self, id: u64, why: Close) {
        let Some(conn) = self.conns.remove(&id) else {
            return;
        };
        let _ = conn.stream.shutdown(Shutdown::Both);
        let Some(rank) = conn.rank else {
            return;
        };
        if self.pes[rank] != Pe::Joined(id) {
            return; // said goodbye before
        }
        self.pes[rank] = Pe::Left;
        if self.failed.is_some() {
            return;
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
        if self.ready {
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
        self.pes
            .iter()
            .filter_map(|&pe| match pe {
                Pe::Joined(id) => Some(id),
                _ => None,
            })
            .collect()
    }

    fn send(&mut self, id: u64, kind: u8, body: &[u8]) {
        self.send_frame(id, &wire::frame(kind, body));
    }

    fn send_frame(&mut self, id: u64, frame: &[u8]) {
        if let Some(conn) = self.conns.get_mut(&id) {
            if let Err(e) = (&*conn.stream).write_all(frame) {
                self.dead.push((id, format!("cannot send to it: {e}")));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bootstrap::tcp::Client;
    use std::path::Path;

    fn sh(n: usize, script: &str) -> Launch {
        Launch::new(n, "sh").args(["-c", script])
    }

    fn captured(launch: Launch) -> (Launch, Arc<Mutex<Vec<u8>>>) {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let launch = Launch { capture: Some(buf.clone()), ..launch.tag_output(true) };
        (launch, buf)
    }

    fn text(buf: &Mutex<Vec<u8>>) -> String {
        String::from_utf8_lossy(&lock(buf)).into_owned()
    }

    #[test]
    #[cfg_attr(miri, ignore = "Miri: no processes (it starts PEs)")]
    fn exit_codes_and_first_failure() {
        let out = sh(4, "sleep 0.$SHMEM_RANK; exit $SHMEM_RANK").kill_on_failure(false).run().unwrap();
        let codes: Vec<_> = out.statuses.iter().map(|s| s.code()).collect();
        assert_eq!(codes, [Some(0), Some(1), Some(2), Some(3)]);
        let (rank, status) = out.first_failure.unwrap();
        assert_eq!((rank, status.code()), (1, Some(1)));
        assert_eq!(out.exit_code(), 1);
        assert!(!out.success());
        assert_eq!(out.to_string(), "PE 1 exited with status 1");

        let out = sh(3, "exit 0").run().unwrap();
        assert!(out.success());
        assert_eq!(out.exit_code(), 0);
        assert_eq!(out.to_string(), "all 3 PEs exited successfully");
    }

    #[test]
    #[cfg_attr(miri, ignore = "Miri: no processes (it starts PEs)")]
    fn failed_job_removes_pe0s_host_heap_leftover() {
        if !Path::new("/dev/shm").is_dir() {
            eprintln!("skipped: no /dev/shm");
            return;
        }
        // PE 0 leaves an object named as a host heap's, and a file that
        // only looks like one (not hex); PE 1 fails the job.
        let script = r#"if [ "$SHMEM_RANK" = 0 ]; then
              : > /dev/shm/shmem-$$-1f2e; : > /dev/shm/shmem-$$-notes; echo $$ > "$PE0"; sleep 100
            else sleep 0.3; exit 4; fi"#;
        let pid_file = std::env::temp_dir().join(format!("shmem-launch-test-{}", std::process::id()));
        let out = sh(2, script).env("PE0", pid_file.to_str().unwrap()).run().unwrap();
        assert_eq!(out.first_failure.map(|(r, s)| (r, s.code())), Some((1, Some(4))));
        let pid = std::fs::read_to_string(&pid_file).unwrap().trim().to_string();
        let _ = std::fs::remove_file(&pid_file);
        assert_eq!(pid, out.pids[0].to_string(), "sh -c's $$ is the PE's pid");
        assert!(!Path::new(&format!("/dev/shm/shmem-{pid}-1f2e")).exists(), "the leftover was removed");
        let other = format!("/dev/shm/shmem-{pid}-notes");
        assert!(Path::new(&other).exists(), "only names of the host heap's form are removed");
        std::fs::remove_file(other).unwrap();
    }

    #[test]
    #[cfg_attr(miri, ignore = "Miri: no processes (it starts PEs)")]
    fn first_failure_stops_the_others() {
        let start = Instant::now();
        // `sleep` runs as the shell's child: stopping the group ends it too.
        let out = sh(4, r#"[ "$SHMEM_RANK" = 2 ] && exit 3; sleep 100"#).run().unwrap();
        assert!(start.elapsed() < Duration::from_secs(2), "took {:?}", start.elapsed());
        let (rank, status) = out.first_failure.unwrap();
        assert_eq!((rank, status.code()), (2, Some(3)));
        assert_eq!(out.exit_code(), 3);
        assert_eq!(out.to_string(), "PE 2 exited with status 3");
        for r in [0, 1, 3] {
            assert_eq!(out.statuses[r].signal(), Some(libc::SIGTERM), "PE {r}");
        }
    }

    #[test]
    #[cfg_attr(miri, ignore = "Miri: no processes (it starts PEs)")]
    fn stubborn_pes_get_sigkill_after_the_grace() {
        let start = Instant::now();
        // PE 0 fails once PE 1 had time to ignore SIGTERM.
        let script = r#"[ "$SHMEM_RANK" = 0 ] && sleep 0.4 && exit 1; trap '' TERM; while :; do sleep 0.05; done"#;
        let out = sh(2, script).kill_grace(Duration::from_millis(200)).run().unwrap();
        assert!(start.elapsed() < Duration::from_secs(2), "took {:?}", start.elapsed());
        assert_eq!(out.statuses[1].signal(), Some(libc::SIGKILL));
        assert_eq!(out.exit_code(), 1);
    }

    #[test]
    #[cfg_attr(miri, ignore = "Miri: no processes (it starts PEs)")]
    fn killed_by_a_signal() {
        let out = sh(2, r#"[ "$SHMEM_RANK" = 1 ] && kill -KILL $$; sleep 100"#).run().unwrap();
        assert_eq!(out.first_failure.map(|(r, _)| r), Some(1));
        assert_eq!(out.exit_code(), 128 + 9);
        assert_eq!(out.to_string(), "PE 1 was killed by signal 9 (SIGKILL)");
    }

    #[test]
    #[cfg_attr(miri, ignore = "Miri: no processes (it starts PEs)")]
    fn environment_arguments_and_tagged_output() {
        let script = r#"echo "$SHMEM_RANK $SHMEM_WORLD_SIZE $SHMEM_LOCAL_RANK $SHMEM_LOCAL_SIZE $SHMEM_RENDEZVOUS $FOO $1"
                        echo "err $SHMEM_RANK" >&2
                        printf 'no newline'"#;
        let (launch, buf) = captured(sh(3, script).args(["sh", "-x"]).env("FOO", "bar"));
        let out = launch.run().unwrap();
        assert!(out.success());
        let text = text(&buf);
        let mut lines: Vec<&str> = text.lines().collect();
        lines.sort();
        assert_eq!(lines.len(), 9, "{text}");
        for rank in 0..3 {
            let env_line = lines.iter().find(|l| l.starts_with(&format!("[{rank}] {rank} 3 {rank} 3 127.0.0.1:")));
            let env_line = env_line.unwrap_or_else(|| panic!("no environment line of PE {rank} in {text}"));
            assert!(env_line.ends_with(" bar -x"), "{env_line}");
            assert!(lines.contains(&format!("[{rank}] err {rank}").as_str()), "{text}");
            assert!(lines.contains(&format!("[{rank}] no newline").as_str()), "{text}");
        }
    }

    #[test]
    fn forward_lines_tags_every_line() {
        let buf = Arc::new(Mutex::new(Vec::new()));
        forward_lines(7, &b"a\n\nb\xff\nlast"[..], &Sink::Buffer(buf.clone()));
        assert_eq!(&*lock(&buf), b"[7] a\n[7] \n[7] b\xff\n[7] last\n");
    }

    #[test]
    #[cfg_attr(miri, ignore = "Miri: no processes (it starts PEs)")]
    fn start_errors() {
        let e = Launch::new(0, "true").run().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        let e = Launch::new(2, "/nonexistent/shmem-test-program").run().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(e.to_string().contains("for PE 0"), "{e}");
    }

    #[test]
    #[cfg_attr(miri, ignore = "Miri: no processes (it starts PEs)")]
    fn forwards_signals() {
        let script = r#"echo started; exec sleep 100"#;
        let (launch, buf) = captured(sh(2, script).forward_signals(true));
        let waiter = thread::spawn(move || launch.run());
        // Signal ourselves only once both PEs run, so that the handler is
        // surely installed.
        let deadline = Instant::now() + Duration::from_secs(5);
        while text(&buf).matches("started").count() < 2 && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(10));
        }
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(libc::getpid(), libc::SIGHUP) };
        let out = waiter.join().unwrap().unwrap();
        assert_eq!(out.statuses.iter().map(|s| s.signal()).collect::<Vec<_>>(), [Some(libc::SIGHUP); 2]);
        assert_eq!(out.exit_code(), 128 + libc::SIGHUP);
    }

    /// Environment variable that makes `child_pe` act as a PE of a test job.
    const ROLE: &str = "SHMEM_LAUNCH_TEST_ROLE";

    /// Not a test by itself: the body of the PEs that the tests below start
    /// by re-running this test binary.
    #[test]
    fn child_pe() {
        let Ok(role) = std::env::var(ROLE) else {
            return;
        };
        let timeout = Duration::from_secs(5);
        let rank: usize = std::env::var("SHMEM_RANK").unwrap().parse().unwrap();
        match role.as_str() {
            "allgather" => {
                let mut c = Client::connect_from_env(timeout).unwrap();
                for round in 0..3 {
                    let all = c.allgather(format!("{rank}:{round}").as_bytes()).unwrap();
                    let want: Vec<Vec<u8>> = (0..c.size()).map(|r| format!("{r}:{round}").into_bytes()).collect();
                    assert_eq!(all, want);
                }
                c.close();
            }
            "crash" => {
                let mut c = Client::connect_from_env(timeout).unwrap();
                if rank == 1 {
                    std::process::exit(7); // no goodbye
                }
                let err = c.allgather(b"x").unwrap_err().to_string();
                assert!(err.contains("PE 1 left during bootstrap"), "{err}");
                println!("saw: {err}");
            }
            "early-exit" => {
                if rank == 1 {
                    std::process::exit(5);
                }
                let err = Client::connect_from_env(timeout).err().unwrap().to_string();
                assert!(err.contains("PE 1 exited with status 5 before connecting"), "{err}");
                println!("saw: {err}");
            }
            other => panic!("unknown role {other}"),
        }
    }

    fn self_launch(n: usize, role: &str) -> (Outcome, String) {
        let exe = std::env::current_exe().unwrap();
        let launch = Launch::new(n, exe)
            .args(["--exact", "launch::tests::child_pe", "--nocapture", "--test-threads=1", "-q"])
            .env(ROLE, role)
            .kill_on_failure(false);
        let (launch, buf) = captured(launch);
        let out = launch.run().unwrap();
        (out, text(&buf))
    }

    #[test]
    #[cfg_attr(miri, ignore = "Miri: no processes (it starts PEs)")]
    fn self_launched_pes_allgather() {
        let (out, text) = self_launch(3, "allgather");
        assert!(out.success(), "{out}\n{text}");
    }

    #[test]
    #[cfg_attr(miri, ignore = "Miri: no processes (it starts PEs)")]
    fn crashed_pe_fails_the_others_bootstrap() {
        let (out, text) = self_launch(3, "crash");
        assert_eq!(out.first_failure.map(|(r, s)| (r, s.code())), Some((1, Some(7))), "{text}");
        assert!(out.statuses[0].success() && out.statuses[2].success(), "{text}");
        assert_eq!(text.matches("saw: ").count(), 2, "{text}");
    }

    #[test]
    #[cfg_attr(miri, ignore = "Miri: no processes (it starts PEs)")]
    fn pe_exiting_before_connecting_fails_the_others_bootstrap() {
        let (out, text) = self_launch(3, "early-exit");
        assert_eq!(out.first_failure.map(|(r, s)| (r, s.code())), Some((1, Some(5))), "{text}");
        assert!(out.statuses[0].success() && out.statuses[2].success(), "{text}");
    }

    #[test]
    #[cfg_attr(miri, ignore = "Miri: no sockets (a rendezvous server)")]
    fn server_runs_many_times() {
        for _ in 0..20 {
            let server = RendezvousServer::start(2).unwrap();
            // A stray connection that never says hello must not keep the
            // server from stopping.
            let _stray = TcpStream::connect(server.addr()).unwrap();
            server.shutdown();
        }
        let server = RendezvousServer::start(1).unwrap();
        let tok = server.token();
        let mut c = Client::connect(&server.addr().to_string(), 0, 1, &tok, Duration::from_secs(2)).unwrap();
        assert_eq!(c.allgather(b"z").unwrap(), vec![b"z".to_vec()]);
        drop(server); // drop stops it too
        assert!(c.allgather(b"z").is_err());
    }
}
