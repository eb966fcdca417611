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
//! [`Launch::nodes`] emulates several nodes on this machine: each PE is told
//! its node (`SHMEM_NODE_ID`) and its rank and size within it, so that the
//! runtime treats the PEs of different nodes as it would on different
//! machines.
//!
//! A program that should also run on its own hands its body to
//! [`spmd_main`]: under a launcher the body runs as this PE; run directly,
//! the program starts a job of itself, one PE per GPU on the gpu backend.
//!
//! ```no_run
//! fn main() -> std::process::ExitCode {
//!     // 2 PEs on the host backend; on the gpu backend one per GPU.
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

mod output;
mod pes;
mod signals;
#[cfg(test)]
mod tests;

use crate::bootstrap::env;
use crate::bootstrap::server::RendezvousServer;
use crate::bootstrap::tcp::Token;
use output::Sink;
use signals::SignalForwarding;
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::io::{self, IsTerminal, Read};
use std::net::SocketAddr;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
#[cfg(test)]
use std::sync::Arc;
use std::sync::{Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

/// The `main` of an SPMD program that also runs on its own (the examples,
/// a quick test). Started by a launcher (`shmemrun`, `mpirun`, `srun`: see
/// [`crate::bootstrap::started_by_launcher`]), it runs `body` as this PE
/// and, if `body` fails, prints `name failed: <error>` and returns 1.
///
/// Started directly, it starts a job of this same program with the same
/// arguments, as many PEs as the backend that `init` will pick takes
/// (`SHMEM_BACKEND`, `auto` by default): on the gpu backend one per GPU
/// this process sees (`CUDA_VISIBLE_DEVICES` applies; `SHMEM_PES_PER_GPU`
/// per GPU if set), on the host backend `host_pes`. It prints how many and
/// why (`quickstart: 2 PEs, one per GPU (gpu backend)`), tags each output
/// line with its PE, stops the job at the first failure, says which PE
/// failed if one did, and returns the job's exit code (see
/// [`Outcome::exit_code`], saturated to 255).
pub fn spmd_main<E: fmt::Display>(name: &str, host_pes: usize, body: impl FnOnce() -> Result<(), E>) -> ExitCode {
    if crate::bootstrap::started_by_launcher() {
        return match body() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("{name} failed: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let pes::Choice { pes, why } = pes::choose_here(host_pes);
    println!("{name}: {why}");
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

/// The most PEs this machine takes on the backend `init` will pick: on the
/// gpu backend one per GPU this process sees (times `SHMEM_PES_PER_GPU`),
/// `None` on the host backend (no limit of the machine's). For programs
/// that choose their own job sizes, as the SPMD test suite does.
pub fn machine_pes() -> Option<usize> {
    pes::gpu_pes_here()
}

/// The most PEs the gpu backend takes on this machine, whatever
/// `SHMEM_BACKEND` says (one per GPU this process sees, times
/// `SHMEM_PES_PER_GPU`), or why it cannot run here ("no CUDA driver
/// (libcuda.so.1) found"). For a program that starts a job on the gpu
/// backend from a process on another, as the SPMD suite's scenarios do.
pub fn gpu_pes() -> Result<usize, String> {
    pes::gpu_capacity()
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
/// NVSHMEM's switch for multi-node NVLink, which must be off when nodes are
/// emulated on one machine whose GPUs report an NVLink fabric.
const DISABLE_MNNVL: &str = "NVSHMEM_DISABLE_MNNVL";

/// A job to start: `n_pes` copies of one program on this machine.
///
/// Built with [`Launch::new`] and the chainable setters, started with
/// [`Launch::run`].
#[derive(Debug, Clone)]
pub struct Launch {
    n_pes: usize,
    /// Emulated nodes, each with `n_pes / nodes` PEs.
    nodes: usize,
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
            nodes: 1,
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

    /// Emulates `k` nodes on this machine (default: 1, the machine). PE `r`
    /// is on node `r / (n/k)`, where `n` is the number of PEs, which `k`
    /// must divide ([`Launch::run`] fails otherwise). Every PE gets
    /// `SHMEM_NODE_ID=node<j>` for its node `j`, `SHMEM_LOCAL_RANK = r %
    /// (n/k)` and `SHMEM_LOCAL_SIZE = n/k`, and `NVSHMEM_DISABLE_MNNVL=1`
    /// unless that is set already (NVSHMEM stays on one node: the PEs of one
    /// machine reach each other by P2P).
    ///
    /// With one node, the PEs get no `SHMEM_NODE_ID`, even if this process
    /// has one (a PE that starts a job of its own passes its environment
    /// on), unless [`Launch::env`] sets it.
    pub fn nodes(mut self, k: usize) -> Launch {
        self.nodes = k;
        self
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
    /// `SHMEM_*` variables take precedence (see [`Launch::nodes`] for
    /// `SHMEM_NODE_ID`).
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
    /// Fails only if the job cannot be started (no PEs, PEs that cannot be
    /// split evenly over the [`Launch::nodes`], the program cannot be
    /// spawned, the rendezvous cannot listen); a PE that fails is reported
    /// in the [`Outcome`]. Any PE already started is stopped and reaped
    /// before an error is returned.
    pub fn run(&self) -> io::Result<Outcome> {
        if self.n_pes == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "a job needs at least one PE"));
        }
        if self.nodes == 0 || self.n_pes % self.nodes != 0 {
            let (n, k) = (self.n_pes, self.nodes);
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{n} PEs cannot be spread evenly over {k} nodes (the number of nodes must divide {n})"),
            ));
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
        // A PE that died between creating a host-backend shared object
        // and every PE mapping it (when any PE unlinks it) left it in
        // /dev/shm: its name starts with that PE's pid (PE 0's for the
        // heap, each node's first PE's for its control area).
        if !result.as_ref().is_ok_and(Outcome::success) {
            let pids: Vec<u32> = children.iter().map(Child::id).collect();
            remove_host_heap_leftovers(&pids, started);
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
            let mut cmd = self.command(rank, addr, token);
            cmd.stdin(if rank == 0 && !stdin_is_tty { Stdio::inherit() } else { Stdio::null() });
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

    /// The command that starts PE `rank`, with its arguments and
    /// environment.
    fn command(&self, rank: usize, addr: SocketAddr, token: Token) -> Command {
        let per_node = self.n_pes / self.nodes;
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args);
        // Defaults, which the caller's variables override.
        cmd.env_remove(env::NODE_ID);
        if self.nodes > 1 && std::env::var_os(DISABLE_MNNVL).is_none() {
            cmd.env(DISABLE_MNNVL, "1");
        }
        cmd.envs(self.envs.iter().map(|(k, v)| (k, v)))
            .env(env::RANK, rank.to_string())
            .env(env::WORLD_SIZE, self.n_pes.to_string())
            .env(env::LOCAL_RANK, (rank % per_node).to_string())
            .env(env::LOCAL_SIZE, per_node.to_string())
            .env(env::RENDEZVOUS, addr.to_string())
            .env(env::RENDEZVOUS_TOKEN, token.to_hex())
            .process_group(0);
        if self.nodes > 1 {
            cmd.env(env::NODE_ID, format!("node{}", rank / per_node));
        }
        cmd
    }

    /// Starts a thread that copies `from` to `sink` line by line, tagged
    /// with `rank` (in tests, to the capture buffer instead).
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
        output::spawn_forwarder(rank, from, sink, done)
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
    /// the PE that made it>-…` objects.
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

pub use crate::bootstrap::exit::describe_status;

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

/// Removes the host backend's shared objects (`/dev/shm/shmem-<pid>-<hex>`)
/// of this user made since `since` by any of the PEs `pids`: what a PE
/// that died during start-up leaves (PE 0 makes the heap, each node's
/// first PE its control area). The age and owner checks keep an unrelated
/// job's object safe should a pid have been reused. A PE started through a
/// wrapper (such as compute-sanitizer) has another pid, and its leftover
/// stays.
fn remove_host_heap_leftovers(pids: &[u32], since: std::time::SystemTime) {
    use std::os::unix::fs::MetadataExt;
    let Ok(dir) = std::fs::read_dir("/dev/shm") else { return };
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !pids.iter().any(|&pid| crate::shm::is_object_of(name, pid)) {
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

/// Locks a mutex, ignoring poisoning (the data stays consistent: every
/// critical section here is a single push or counter update).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
