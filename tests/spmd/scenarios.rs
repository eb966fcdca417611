//! Multi-process scenarios that a test launches as a job of its own: a PE
//! that dies (exits, or is killed by SIGKILL in the middle of a barrier, an
//! all-reduce or a MoE dispatch, on one node or on one of 2 emulated nodes,
//! where the victim may be its node's delegate), a PE that never starts,
//! mismatched start-up settings, a setting that cannot be read, use after
//! finalize, and RMA through an RDMA device. The tests run in the 1-PE
//! world (each launches its own job; running them from every world would
//! only repeat them; the others report them as ignored). After each job,
//! nothing named after its PEs may be left in `/dev/shm`.
//!
//! The scenarios' PEs run on the host backend, whatever the suite's own PE
//! runs on: their jobs of 2 to 4 PEs would not fit a box of fewer GPUs (the
//! GPU backend refuses more PEs than a node's GPUs take).
//! `SHMEM_TEST_SCENARIO_BACKEND=gpu` runs them on the GPU backend instead;
//! `SHMEM_TEST_FAULT_PES` sets the size of the `sigkill_in_*` jobs (3 by
//! default, at most the GPUs' count on the GPU backend). `rma_over_rdma`'s
//! job runs on the GPU backend always: 2 PEs that reach each other through
//! NVSHMEM's remote transport, where there is an RDMA device and the GPU
//! backend takes 2 PEs.

use crate::util::{Env, NotApplicable, TestResult};
use crate::TestFn;
use shmem::launch::Launch;
use shmem::{Cmp, Error, ReduceOp, SignalOp};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

pub const TESTS: &[(&str, TestFn)] = &[
    ("scenario::dead_pe_fails_barrier_waiters", dead_pe_fails_barrier_waiters),
    ("scenario::dead_pe_fails_signal_waiters", dead_pe_fails_signal_waiters),
    ("scenario::dead_pe_across_nodes_named_over_echoes", dead_pe_across_nodes_named_over_echoes),
    ("scenario::pe_that_never_starts", pe_that_never_starts),
    ("scenario::launcher_ends_job_when_a_pe_fails", launcher_ends_job_when_a_pe_fails),
    ("scenario::heap_size_differs", heap_size_differs),
    ("scenario::bad_settings_fail_every_pe", bad_settings_fail_every_pe),
    ("scenario::use_after_finalize_and_foreign", use_after_finalize_and_foreign),
    ("scenario::collectives_on_different_teams", collectives_on_different_teams),
    ("scenario::collectives_on_different_teams_across_nodes", collectives_on_different_teams_across_nodes),
    ("scenario::sigkill_in_barrier", sigkill_in_barrier),
    ("scenario::sigkill_in_all_reduce", sigkill_in_all_reduce),
    ("scenario::sigkill_in_dispatch_2d", sigkill_in_dispatch_2d),
    ("scenario::sigkill_across_nodes_in_barrier", sigkill_across_nodes_in_barrier),
    ("scenario::sigkill_across_nodes_in_all_reduce", sigkill_across_nodes_in_all_reduce),
    ("scenario::sigkill_across_nodes_in_dispatch_2d", sigkill_across_nodes_in_dispatch_2d),
    ("scenario::sigkill_across_nodes_delegate_in_barrier", sigkill_across_nodes_delegate_in_barrier),
    ("scenario::sigkill_across_nodes_delegate_in_all_reduce", sigkill_across_nodes_delegate_in_all_reduce),
    ("scenario::rma_over_rdma", rma_over_rdma),
];

/// Exit code of a scenario PE that saw what it should.
const SAW_IT: u8 = 0;
/// Exit code of a PE that is told to die.
const DIES: i32 = 3;
/// Exit code of a PE that saw its peer leave after the peer found the fault.
const PEER_LEFT: i32 = 4;
/// Exit code of a PE that saw a peer killed in the middle of an operation:
/// an error, as a program that lost a peer ends.
const SAW_FAULT: i32 = 5;

/// The outcome of launching scenario `name` on `n` PEs.
fn launch(name: &str, n: usize, kill_on_failure: bool, env: &[(&str, &str)]) -> (shmem::launch::Outcome, Duration) {
    launch_on_nodes(name, n, 1, kill_on_failure, env)
}

/// The outcome of launching scenario `name` on `n` PEs split into `nodes`
/// emulated nodes.
fn launch_on_nodes(
    name: &str,
    n: usize,
    nodes: usize,
    kill_on_failure: bool,
    env: &[(&str, &str)],
) -> (shmem::launch::Outcome, Duration) {
    let exe = std::env::current_exe().unwrap();
    // The backend first: a scenario's own setting (`env`) comes after it.
    let backend = std::env::var("SHMEM_TEST_SCENARIO_BACKEND").unwrap_or_else(|_| "host".into());
    let mut l = Launch::new(n, exe)
        .env("SHMEM_TEST_SCENARIO", name)
        .env("SHMEM_BACKEND", backend)
        .nodes(nodes)
        .kill_on_failure(kill_on_failure)
        .tag_output(true);
    for (k, v) in env {
        l = l.env(k, v);
    }
    let start = Instant::now();
    let outcome = l.run().expect("launching the scenario");
    let took = start.elapsed();
    let left = shm_leftovers(&outcome.pids);
    assert!(left.is_empty(), "scenario {name} left {left:?} in /dev/shm");
    (outcome, took)
}

/// Entries of `/dev/shm` named after one of `pids` (a number of their name
/// equal to one): what a job of these PEs left behind. The host backend's
/// object is `/shmem-<pid of PE 0>-<id>`; entries of other jobs, named
/// after their own PEs, are not counted.
fn shm_leftovers(pids: &[u32]) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/dev/shm") else { return Vec::new() };
    dir.filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .filter(|name| {
            name.split(|c: char| !c.is_ascii_digit()).any(|num| num.parse().is_ok_and(|x: u32| pids.contains(&x)))
        })
        .collect()
}

/// Each PE's exit code (-1 for a PE killed by a signal).
fn exit_codes(o: &shmem::launch::Outcome) -> Vec<i32> {
    o.statuses.iter().map(|s| s.code().unwrap_or(-1)).collect()
}

/// Whether this is the 1-PE world, where the scenarios run.
fn only_in_one_pe_world(env: &Env) -> Result<(), NotApplicable> {
    match env.n() {
        1 => Ok(()),
        n => Err(NotApplicable(format!(
            "runs in the 1-PE world only, as it starts jobs of its own; this world has {n} PEs"
        ))),
    }
}

fn dead_pe_fails_barrier_waiters(env: &Env) -> TestResult {
    only_in_one_pe_world(env)?;
    let (o, took) = launch("die_then_barrier", 3, false, &[]);
    assert!(took < Duration::from_secs(30), "took {took:?}");
    let codes = exit_codes(&o);
    assert_eq!(codes, vec![SAW_IT as i32, SAW_IT as i32, DIES], "PE exit codes");
    Ok(())
}

fn dead_pe_fails_signal_waiters(env: &Env) -> TestResult {
    only_in_one_pe_world(env)?;
    let (o, took) = launch("die_then_signal_wait", 2, false, &[]);
    assert!(took < Duration::from_secs(30), "took {took:?}");
    assert_eq!(exit_codes(&o), vec![SAW_IT as i32, DIES]);
    Ok(())
}

/// A PE that left on the news of a death is an echo of it: a wait that
/// finds it gone names the dead PE (see [`echo_of_a_death`]).
fn dead_pe_across_nodes_named_over_echoes(env: &Env) -> TestResult {
    only_in_one_pe_world(env)?;
    let (o, took) = launch_on_nodes("echo_of_a_death", 4, 2, false, &[]);
    assert!(took < Duration::from_secs(30), "took {took:?}");
    assert_eq!(exit_codes(&o), vec![SAW_IT as i32, DIES, SAW_IT as i32, SAW_IT as i32]);
    Ok(())
}

fn pe_that_never_starts(env: &Env) -> TestResult {
    only_in_one_pe_world(env)?;
    let (o, took) = launch("never_start", 3, false, &[("SHMEM_PEER_TIMEOUT", "2")]);
    assert!(took < Duration::from_secs(20), "took {took:?}");
    assert_eq!(exit_codes(&o), vec![SAW_IT as i32, DIES, SAW_IT as i32]);
    Ok(())
}

fn launcher_ends_job_when_a_pe_fails(env: &Env) -> TestResult {
    only_in_one_pe_world(env)?;
    // PE 2 fails at once; the others would wait for it for ever in init (no
    // peer timeout): the launcher must end them and report PE 2's status.
    let (o, took) = launch("never_start_no_timeout", 4, true, &[("SHMEM_PEER_TIMEOUT", "3600")]);
    assert!(took < Duration::from_secs(30), "took {took:?}");
    assert_eq!(o.exit_code(), DIES);
    Ok(())
}

fn heap_size_differs(env: &Env) -> TestResult {
    only_in_one_pe_world(env)?;
    let (o, _) = launch("heap_size_differs", 2, false, &[]);
    assert_eq!(exit_codes(&o), vec![SAW_IT as i32; 2]);
    Ok(())
}

/// A setting that cannot be read fails `init` on every PE with
/// `Error::Config`, naming the variable, the value and the PEs that have it,
/// also when only one PE has it; nothing is left in `/dev/shm` (checked by
/// [`launch`]).
fn bad_settings_fail_every_pe(env: &Env) -> TestResult {
    only_in_one_pe_world(env)?;
    // (variable, value, the one PE that has it (None: every PE), what every PE's error says)
    let cases: &[(&str, &str, Option<usize>, &str)] = &[
        // Used to panic in `Duration::from_secs_f64`.
        ("SHMEM_PEER_TIMEOUT", "1e30", None, "SHMEM_PEER_TIMEOUT=\"1e30\": expected a number of seconds"),
        // Used to overflow when rounded up to whole pages.
        ("SHMEM_HEAP_SIZE", "18446744073709551615", None, "more than one mapping can hold (on every PE)"),
        ("SHMEM_WAIT_TIMEOUT", "-1", None, "SHMEM_WAIT_TIMEOUT=\"-1\""),
        ("SHMEM_BACKEND", "cuda", None, "SHMEM_BACKEND=\"cuda\": expected auto, gpu or host (on every PE)"),
        ("SHMEM_HEAP_SIZE", "12Q", Some(1), "SHMEM_HEAP_SIZE=\"12Q\": expected bytes"),
        ("SHMEM_FORCE_RMA", "maybe", Some(2), "SHMEM_FORCE_RMA=\"maybe\": expected 1 (on) or 0 (off) (on PE 2)"),
        ("SHMEM_FORCE_RMA", "1", Some(0), "SHMEM_FORCE_RMA differs across PEs: PE 0 has it on, PE 1 off"),
    ];
    for &(var, value, on_pe, want) in cases {
        let pe = on_pe.map_or(String::new(), |pe| pe.to_string());
        let mut vars = vec![("SHMEM_TEST_EXPECT", want), ("SHMEM_TEST_BAD_PE", pe.as_str())];
        match on_pe {
            None => vars.push((var, value)),
            Some(_) => vars.extend([("SHMEM_TEST_BAD_VAR", var), ("SHMEM_TEST_BAD_VALUE", value)]),
        }
        let (o, took) = launch("bad_setting", 3, false, &vars);
        assert!(took < Duration::from_secs(20), "{var}={value:?}: took {took:?}");
        assert_eq!(exit_codes(&o), vec![SAW_IT as i32; 3], "{var}={value:?} on {on_pe:?}: PE exit codes");
    }
    Ok(())
}

fn use_after_finalize_and_foreign(env: &Env) -> TestResult {
    only_in_one_pe_world(env)?;
    // A process of its own, started with no launcher: a world of one PE,
    // which may initialise again after finalizing.
    let mut cmd = Command::new(std::env::current_exe()?);
    for (k, _) in std::env::vars() {
        if k.starts_with("SHMEM_") || k.starts_with("OMPI_") || k.starts_with("PMI") {
            cmd.env_remove(k);
        }
    }
    let status = cmd.env("SHMEM_TEST_SCENARIO", "lifecycle").status()?;
    assert!(status.success(), "lifecycle scenario: {status}");
    Ok(())
}

fn collectives_on_different_teams(env: &Env) -> TestResult {
    different_teams_on(env, 1)
}

/// The same with each PE its own node: the delegates see it in each
/// other's messages.
fn collectives_on_different_teams_across_nodes(env: &Env) -> TestResult {
    different_teams_on(env, 2)
}

fn different_teams_on(env: &Env, nodes: usize) -> TestResult {
    only_in_one_pe_world(env)?;
    // PE 0 enters a barrier of a sub-team, PE 1 one of the world: neither
    // can go on; both must say so, quickly, instead of hanging.
    // The first to notice says "collective mismatch"; the other may instead
    // see that PE leave (PEER_LEFT) — a clear error either way. (On the gpu
    // backend, where the device agrees on eager barriers, it is each PE's
    // trapped device wait, within the device's spin budget.)
    let (o, took) = launch_on_nodes("different_teams", 2, nodes, false, &[]);
    assert!(took < Duration::from_secs(20), "took {took:?}");
    let codes = exit_codes(&o);
    assert!(codes.iter().all(|&c| c == SAW_IT as i32 || c == PEER_LEFT), "PE exit codes {codes:?}");
    assert!(codes.contains(&(SAW_IT as i32)), "nobody reported the mismatch: {codes:?}");
    Ok(())
}

/// The PE that the `sigkill_in_*` scenarios kill unless told otherwise:
/// not PE 0, so that with three PEs there are survivors on both sides of
/// it.
const VICTIM: usize = 1;
/// The variable that tells a `sigkill_in_*` job's PEs which PE is killed.
const VICTIM_VAR: &str = "SHMEM_TEST_VICTIM";
/// The wait timeout of the `sigkill_in_*` jobs: the bound on every
/// survivor's wait, should noticing the dead PE fail.
const FAULT_WAIT_TIMEOUT_S: u64 = 5;
/// How long after the job's first barrier the victim is killed.
const KILL_AFTER: Duration = Duration::from_millis(200);
/// How long after its host sees a PE die a device wait for it gives up
/// (GPU backend: the liveness watcher's poll, the wait's look at its word,
/// the trap and its report), with margin.
const DEVICE_GIVE_UP: Duration = Duration::from_secs(3);

/// Whether the scenarios' PEs run on the GPU backend.
fn scenarios_on_gpu() -> bool {
    std::env::var("SHMEM_TEST_SCENARIO_BACKEND").is_ok_and(|b| b.eq_ignore_ascii_case("gpu"))
}

fn sigkill_in_barrier(env: &Env) -> TestResult {
    sigkill_in("sigkill_in_barrier", env)
}

fn sigkill_in_all_reduce(env: &Env) -> TestResult {
    sigkill_in("sigkill_in_all_reduce", env)
}

fn sigkill_in_dispatch_2d(env: &Env) -> TestResult {
    sigkill_in("sigkill_in_dispatch_2d", env)
}

/// The shape of a `sigkill_in_*` job: its PEs, the emulated nodes they
/// are split into (consecutive PEs on each), and the PE that is killed.
#[derive(Debug, Clone, Copy)]
struct FaultJob {
    pes: usize,
    nodes: usize,
    victim: usize,
}

/// 2 nodes × 2 PEs (PEs 0 and 1 on node 0, PEs 2 and 3 on node 1), with
/// [`VICTIM`], a PE of node 0 that is not its delegate, killed.
const TWO_NODES: FaultJob = FaultJob { pes: 4, nodes: 2, victim: VICTIM };
/// [`TWO_NODES`] with node 1's delegate killed: PE 2, the node's lowest
/// PE, which carries its node's messages to the other node's delegate.
const TWO_NODES_DELEGATE_KILLED: FaultJob = FaultJob { victim: 2, ..TWO_NODES };

/// On 2 nodes × 2 PEs: the victim (PE 1, node 0) dies in a barrier; its
/// node's survivor learns it from the node's control object, the other
/// node's PEs from the launcher's news, naming its node.
fn sigkill_across_nodes_in_barrier(env: &Env) -> TestResult {
    sigkill_in_on("sigkill_in_barrier", env, TWO_NODES)
}

fn sigkill_across_nodes_in_all_reduce(env: &Env) -> TestResult {
    sigkill_in_on("sigkill_in_all_reduce", env, TWO_NODES)
}

fn sigkill_across_nodes_in_dispatch_2d(env: &Env) -> TestResult {
    sigkill_in_on("sigkill_in_dispatch_2d", env, TWO_NODES)
}

/// On 2 nodes × 2 PEs, node 1's delegate (PE 2) dies in a barrier: node
/// 0's PEs lose the messages of node 1 and must hear of the death from the
/// launcher, node 1's other PE loses its link to node 0 and must hear of
/// it from its node's control object; each names PE 2, and the PEs of node
/// 0 its node.
fn sigkill_across_nodes_delegate_in_barrier(env: &Env) -> TestResult {
    sigkill_in_on("sigkill_in_barrier", env, TWO_NODES_DELEGATE_KILLED)
}

fn sigkill_across_nodes_delegate_in_all_reduce(env: &Env) -> TestResult {
    sigkill_in_on("sigkill_in_all_reduce", env, TWO_NODES_DELEGATE_KILLED)
}

/// PE [`VICTIM`] of one node is killed by SIGKILL while every PE runs the
/// scenario's operation; see [`sigkill_in_on`].
fn sigkill_in(name: &str, env: &Env) -> TestResult {
    let n: usize = std::env::var("SHMEM_TEST_FAULT_PES").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
    sigkill_in_on(name, env, FaultJob { pes: n, nodes: 1, victim: VICTIM })
}

/// The `job`'s victim is killed by SIGKILL while every PE runs scenario
/// `name`'s operation; each survivor must fail with an error naming it
/// (and, on another node, its node) soon after the kill (checked by the
/// survivors, see [`fault_pe`]), and exit with [`SAW_FAULT`]; the launcher
/// reports the victim's SIGKILL as the job's first failure.
fn sigkill_in_on(name: &str, env: &Env, job: FaultJob) -> TestResult {
    only_in_one_pe_world(env)?;
    let FaultJob { pes: n, nodes, victim } = job;
    assert!(n > victim, "SHMEM_TEST_FAULT_PES={n}: the job needs PE {victim}");
    let scratch = std::env::temp_dir().join(format!("shmem-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let (timeout, victim_pe) = (FAULT_WAIT_TIMEOUT_S.to_string(), victim.to_string());
    let vars = [
        ("SHMEM_WAIT_TIMEOUT", timeout.as_str()),
        ("SHMEM_HEAP_SIZE", "64M"),
        ("SHMEM_TEST_SCRATCH", scratch.to_str().ok_or("a temporary directory that is not UTF-8")?),
        (VICTIM_VAR, victim_pe.as_str()),
    ];
    // Without the launcher's help: the survivors must end by themselves.
    let (o, took) = launch_on_nodes(name, n, nodes, false, &vars);
    let _ = std::fs::remove_dir_all(&scratch);
    eprintln!("{name}: job of {n} PEs on {nodes} node(s), PE {victim} killed, over after {took:?}: {o}");
    let mut want = vec![SAW_FAULT; n];
    want[victim] = -1;
    assert_eq!(exit_codes(&o), want, "PE exit codes (statuses {:?})", o.statuses);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(o.first_failure.map(|(pe, s)| (pe, s.signal())), Some((victim, Some(libc::SIGKILL))), "{o}");
    // Start-up, the kill's delay and the survivors' bounded waits (on the
    // GPU backend also NVSHMEM's start-up and a trapped device wait).
    let bound = Duration::from_secs(if scenarios_on_gpu() { 60 } else { 30 });
    assert!(took < bound, "took {took:?}");
    Ok(())
}

/// Where the kernel lists this machine's RDMA devices (InfiniBand, RoCE).
const RDMA_DEVICES: &str = "/sys/class/infiniband";

/// Puts, gets, signals and an all-reduce on the RMA path between 2 PEs of
/// the gpu backend whose NVSHMEM has its P2P transport off
/// (`NVSHMEM_DISABLE_P2P=1`), so that every byte between them crosses
/// NVSHMEM's remote transport: the RDMA device, as between nodes. Applies
/// where there is an RDMA device and the gpu backend takes 2 PEs.
fn rma_over_rdma(env: &Env) -> TestResult {
    only_in_one_pe_world(env)?;
    let devices: Vec<String> = std::fs::read_dir(RDMA_DEVICES)
        .map(|dir| dir.filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned())).collect())
        .unwrap_or_default();
    if devices.is_empty() {
        return Err(NotApplicable(format!("no RDMA device: {RDMA_DEVICES} is empty or missing")).into());
    }
    match shmem::launch::gpu_pes() {
        Ok(pes) if pes >= 2 => {}
        Ok(pes) => {
            return Err(NotApplicable(format!("needs 2 PEs of the gpu backend; this machine takes {pes}")).into())
        }
        Err(why) => return Err(NotApplicable(format!("no gpu backend here: {why}")).into()),
    }
    eprintln!("rma_over_rdma: RDMA devices {devices:?}");
    let vars = [
        ("SHMEM_BACKEND", "gpu"),
        ("NVSHMEM_DISABLE_P2P", "1"),
        // A lost message fails the job rather than hanging it.
        ("SHMEM_WAIT_TIMEOUT", "60"),
    ];
    let (o, took) = launch("rma_over_rdma", 2, true, &vars);
    eprintln!("rma_over_rdma: job of 2 PEs over after {took:?}: {o}");
    assert_eq!(exit_codes(&o), vec![SAW_IT as i32; 2], "PE exit codes: {o}");
    Ok(())
}

/// A job of 2 PEs whose last PE's all-reduce is shorter, with nothing
/// between it and `finalize`: every PE sees the mismatch once, at the call
/// or at `finalize` (see `deferred.rs`).
pub fn unreported_at_finalize(env: &Env) -> TestResult {
    only_in_one_pe_world(env)?;
    let (o, took) = launch("unreported_at_finalize", 2, false, &[]);
    assert!(took < Duration::from_secs(60), "took {took:?}");
    assert_eq!(exit_codes(&o), vec![SAW_IT as i32; 2], "PE exit codes: {o}");
    Ok(())
}

/// Runs scenario `name` as this PE.
pub fn run(name: &str) -> ExitCode {
    let rank: usize = std::env::var("SHMEM_RANK").ok().and_then(|r| r.parse().ok()).unwrap_or(0);
    let result = match name {
        "die_then_barrier" => die_then(rank, 2, |ctx| ctx.barrier_all(&ctx.stream())),
        "echo_of_a_death" => echo_of_a_death(rank),
        "die_then_signal_wait" => die_then(rank, 1, |ctx| {
            let sig = ctx.alloc_zeroed::<u64>(1)?;
            ctx.barrier_all(&ctx.stream())?;
            ctx.signal_wait_until(&sig, 0, shmem::Cmp::Ge, 1, &ctx.stream()).map(drop)
        }),
        "never_start" | "never_start_no_timeout" => never_start(rank),
        "heap_size_differs" => heap_size_differs_pe(rank),
        "bad_setting" => bad_setting_pe(rank),
        "lifecycle" => lifecycle(),
        "different_teams" => different_teams(rank),
        "sigkill_in_barrier" | "sigkill_in_all_reduce" | "sigkill_in_dispatch_2d" => fault_pe(rank, name),
        "rma_over_rdma" => rma_over_rdma_pe().map_err(|e| e.to_string()),
        "unreported_at_finalize" => crate::deferred::unreported_at_finalize_pe(rank),
        other => Err(format!("unknown scenario {other:?}")),
    };
    match result {
        Ok(()) => ExitCode::from(SAW_IT),
        Err(msg) => {
            eprintln!("scenario {name}, PE {rank}: {msg}");
            ExitCode::FAILURE
        }
    }
}

/// PE `victim` exits right after init; the others must get an error that
/// names it from `then`.
fn die_then(rank: usize, victim: usize, then: impl Fn(&shmem::Context) -> shmem::Result<()>) -> Result<(), String> {
    let ctx = shmem::init().map_err(|e| e.to_string())?;
    // Everyone is up before the victim goes.
    ctx.barrier_all(&ctx.stream()).map_err(|e| e.to_string())?;
    if rank == victim {
        std::process::exit(DIES);
    }
    let start = Instant::now();
    saw_death_of(victim, rank, start, then(&ctx))
}

/// Whether `r`, what PE `rank` got from an operation it began at `start`,
/// is the error that names PE `victim` as lost.
fn saw_death_of(victim: usize, rank: usize, start: Instant, r: shmem::Result<()>) -> Result<(), String> {
    match r {
        Err(Error::PeerLost { pe, what }) if pe == victim => {
            eprintln!("PE {rank} saw, after {:?}: PE {pe} {what}", start.elapsed());
            Ok(())
        }
        Err(e) => Err(format!("wrong error: {e}")),
        Ok(()) => Err("the operation succeeded with a dead peer".into()),
    }
}

/// On 2 nodes × 2 PEs, PE 1 (node 0) exits. PE 3 (node 1) hears of it in a
/// barrier of a team without PE 2 (PEs 1 and 3), and leaves; only then
/// does PE 2 enter a barrier of the world, where its wait for its node's
/// members finds PE 3 gone. It must name the dead PE 1, not PE 3, which
/// left on the news of it.
fn echo_of_a_death(rank: usize) -> Result<(), String> {
    let ctx = shmem::init().map_err(|e| e.to_string())?;
    let s = ctx.stream();
    let odd = ctx.world().split_strided(1, 2, 2).map_err(|e| e.to_string())?;
    ctx.barrier_all(&s).map_err(|e| e.to_string())?;
    let start = Instant::now();
    let r = match (rank, &odd) {
        (1, _) => std::process::exit(DIES),
        (3, Some(odd)) => odd.barrier(&s),
        (2, _) => {
            // Time for PE 3 to hear of PE 1 and leave.
            std::thread::sleep(Duration::from_millis(500));
            ctx.barrier_all(&s)
        }
        _ => ctx.barrier_all(&s),
    };
    saw_death_of(1, rank, start, r)
}

/// PE 1 (or 2) never calls init; the others must fail at start-up.
fn never_start(rank: usize) -> Result<(), String> {
    let n: usize = std::env::var("SHMEM_WORLD_SIZE").unwrap().parse().unwrap();
    if rank == 1 || (n == 4 && rank == 2) {
        std::process::exit(DIES);
    }
    match shmem::init() {
        Err(Error::Bootstrap(msg)) => {
            eprintln!("PE {rank} saw: {msg}");
            Ok(())
        }
        Err(e) => Err(format!("wrong error: {e}")),
        Ok(_) => Err("init succeeded without all PEs".into()),
    }
}

fn different_teams(rank: usize) -> Result<(), String> {
    let ctx = shmem::init().map_err(|e| e.to_string())?;
    let s = ctx.stream();
    let world = ctx.world();
    let team = world.split_strided(0, 1, 2).map_err(|e| e.to_string())?.ok_or("not in the team")?;
    // On the gpu backend an eager barrier is agreed on the device, by its
    // kernel: each PE's kernel waits for the other on its own team's
    // channel until the wait traps (the device prints which peer it waited
    // for), which the stream's synchronisation reports.
    let gpu = ctx.backend() == shmem::BackendKind::Gpu;
    let r = if rank == 0 { team.barrier(&s) } else { world.barrier(&s) };
    match r.and_then(|()| s.synchronize()) {
        Err(Error::CollectiveMismatch(msg)) => {
            eprintln!("PE {rank} saw: {msg}");
            Ok(())
        }
        Err(Error::Cuda(msg)) if gpu => {
            eprintln!("PE {rank} saw the device's wait end: {msg}");
            Ok(())
        }
        Err(Error::PeerLost { pe, what }) if what.contains("left") => {
            eprintln!("PE {rank} saw: PE {pe} {what}");
            std::process::exit(PEER_LEFT)
        }
        Err(e) => Err(format!("wrong error: {e}")),
        Ok(()) => Err("a barrier passed with the other PE in another team's barrier".into()),
    }
}

fn heap_size_differs_pe(rank: usize) -> Result<(), String> {
    match shmem::Config::new().heap_size((1 << 20) + rank * (64 << 10)).init() {
        Err(Error::Config(msg)) if msg.contains("heap size differs") => Ok(()),
        Err(e) => Err(format!("wrong error: {e}")),
        Ok(_) => Err("init succeeded with different heap sizes".into()),
    }
}

/// `SHMEM_TEST_BAD_PE` (if it is this PE) sets `SHMEM_TEST_BAD_VAR` to
/// `SHMEM_TEST_BAD_VALUE` in its own environment; every PE's `init` must
/// fail with a configuration error that says `SHMEM_TEST_EXPECT`.
fn bad_setting_pe(rank: usize) -> Result<(), String> {
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    if var("SHMEM_TEST_BAD_PE") == rank.to_string() {
        // Nothing else runs yet in this process: no thread reads the environment.
        std::env::set_var(var("SHMEM_TEST_BAD_VAR"), var("SHMEM_TEST_BAD_VALUE"));
    }
    let want = var("SHMEM_TEST_EXPECT");
    match shmem::init() {
        Err(Error::Config(msg)) if msg.contains(&want) => {
            eprintln!("PE {rank} saw: {msg}");
            Ok(())
        }
        Err(e) => Err(format!("wrong error: {e} (expected one that says {want:?})")),
        Ok(_) => Err("init succeeded with a bad setting".into()),
    }
}

fn lifecycle() -> Result<(), String> {
    let run = || -> Result<(), Box<dyn std::error::Error>> {
        let ctx = shmem::Config::new().heap_size(1 << 20).init()?;
        let s = ctx.stream();
        let old = ctx.alloc::<f32>(4)?;
        let team = ctx.world();
        ctx.finalize()?;
        // Use after finalize: refused, nothing touched.
        match old.copy_to_host(&s) {
            Err(Error::Finalized(_)) => {}
            other => return Err(format!("copy after finalize: {other:?}").into()),
        }
        match team.barrier(&s) {
            Err(Error::Finalized(_)) => {}
            other => return Err(format!("team barrier after finalize: {other:?}").into()),
        }
        // A new context: the old buffer and team are foreign to it.
        let ctx = shmem::Config::new().heap_size(1 << 20).init()?;
        let s = ctx.stream();
        let new = ctx.alloc::<f32>(4)?;
        new.fill(2.0, &s)?;
        match ctx.put(&new, &old, 0, &s) {
            Err(Error::Foreign(_)) => {}
            other => return Err(format!("put from a foreign buffer: {other:?}").into()),
        }
        match ctx.all_reduce(&old, &new, ReduceOp::Sum, &s) {
            Err(Error::Foreign(_)) => {}
            other => return Err(format!("all_reduce into a foreign buffer: {other:?}").into()),
        }
        match team.broadcast(&new, &new, 0, &s) {
            Err(Error::Foreign(_)) | Err(Error::Finalized(_)) => {}
            other => return Err(format!("collective on an old team: {other:?}").into()),
        }
        assert_eq!(new.copy_to_host(&s)?, vec![2.0; 4]);
        drop(new);
        ctx.finalize()?;
        Ok(())
    };
    run().map_err(|e| e.to_string())
}

/// A PE of [`rma_over_rdma`]'s job. Every value names its sender and its
/// index; outputs are poisoned before each operation.
fn rma_over_rdma_pe() -> Result<(), Box<dyn std::error::Error>> {
    let ctx = shmem::init()?;
    let (s, me, n) = (ctx.stream(), ctx.my_pe(), ctx.n_pes());
    if ctx.backend() != shmem::BackendKind::Gpu || n != 2 {
        return Err(format!("expected 2 PEs on the gpu backend, got {n} on {:?}", ctx.backend()).into());
    }
    let peer = 1 - me;
    // The collectives' kernels reach the peer by NVSHMEM's RMA too.
    ctx.set_force_rma(true);
    let value = |pe: usize, i: usize| (pe as u64 + 1) << 40 | i as u64;
    let poison = 0x5a5a_5a5a_5a5a_5a5a_u64;
    let check = |got: &[u64], want: &dyn Fn(usize) -> u64, what: &str| -> Result<(), String> {
        match (0..got.len()).find(|&i| got[i] != want(i)) {
            Some(i) => Err(format!("{what}: element {i} of {} is {:#x}, expected {:#x}", got.len(), got[i], want(i))),
            None => Ok(()),
        }
    };
    // 8 MiB: many of the transport's messages.
    let len = 1 << 20;
    let src = ctx.alloc::<u64>(len)?;
    let dst = ctx.alloc::<u64>(len)?;
    let sig = ctx.alloc_zeroed::<u64>(2)?;
    if dst.peer_ptr(peer).is_some() {
        return Err(format!("PE {peer} has a direct address with NVSHMEM_DISABLE_P2P=1: no RDMA would be used").into());
    }
    src.copy_from_host(&(0..len).map(|i| value(me, i)).collect::<Vec<_>>(), &s)?;

    dst.fill(poison, &s)?;
    ctx.barrier_all(&s)?;
    ctx.put(&dst, &src, peer, &s)?;
    ctx.barrier_all(&s)?;
    check(&dst.copy_to_host(&s)?, &|i| value(peer, i), "put")?;

    // Shifted by one element, so that a wrong offset shows.
    dst.fill(poison, &s)?;
    ctx.barrier_all(&s)?;
    ctx.get(dst.slice(1..), src.slice(..len - 1), peer, &s)?;
    check(&dst.copy_to_host(&s)?, &|i| if i == 0 { poison } else { value(peer, i - 1) }, "get")?;

    // The receiver waits for the signal, not a barrier.
    dst.fill(poison, &s)?;
    ctx.barrier_all(&s)?;
    ctx.put_signal(&dst, &src, &sig, 0, 1000 + me as u64, SignalOp::Set, peer, &s)?;
    let seen = ctx.signal_wait_until(&sig, 0, Cmp::Eq, 1000 + peer as u64, &s)?;
    check(&[seen], &|_| 1000 + peer as u64, "put_signal's signal")?;
    check(&dst.copy_to_host(&s)?, &|i| value(peer, i), "put_signal's data")?;
    ctx.signal_op(&sig, 1, 10 + me as u64, SignalOp::Add, peer, &s)?;
    let seen = ctx.signal_wait_until(&sig, 1, Cmp::Ge, 10 + peer as u64, &s)?;
    check(&[seen], &|_| 10 + peer as u64, "signal_op's add")?;

    // Sums of both PEs' values, exact in u64: small and large (every path
    // of the all-reduce kernels).
    for count in [1000, len] {
        dst.fill(poison, &s)?;
        ctx.barrier_all(&s)?;
        ctx.all_reduce(dst.slice(..count), src.slice(..count), ReduceOp::Sum, &s)?;
        let got = dst.copy_to_host(&s)?;
        check(&got[..count], &|i| value(0, i) + value(1, i), &format!("all_reduce of {count}"))?;
        check(&got[count..], &|_| poison, &format!("past the all_reduce of {count}"))?;
    }
    ctx.barrier_all(&s)?;
    eprintln!("PE {me}: put, get, put_signal, signal_op and all_reduce over NVSHMEM's remote transport: ok");
    drop((src, dst, sig));
    ctx.finalize()?;
    Ok(())
}

/// Microseconds since the Unix epoch: a clock that every process of the
/// machine shares.
fn unix_micros() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros())
}

/// A PE of a `sigkill_in_*` scenario, whose victim `SHMEM_TEST_VICTIM`
/// names. Every PE runs the operation over and over; a thread of the
/// victim kills it with SIGKILL [`KILL_AFTER`] into the loop. The victim's
/// main thread does nothing but the operation, so the kill lands inside
/// one — in its exchange, its data movement or a barrier of it, wherever
/// the thread happens to be — while the survivors are inside the same or
/// the next one, waiting for the victim. (Killing a victim that waits
/// outside, after the others entered, would only test the first of these.)
/// Each survivor must then fail:
///
/// - host backend: with [`Error::PeerLost`] naming the victim as dead (on
///   another node than the victim's, naming its node too);
/// - GPU backend: the same, or — when the kill caught the victim's kernel
///   on the device — the trapped device wait, reported as [`Error::Cuda`]
///   (the device printed that a wait stopped waiting for a peer) or a
///   [`Error::Timeout`];
///
/// within the wait timeout of the kill (plus [`DEVICE_GIVE_UP`] on the GPU
/// backend), and exit with [`SAW_FAULT`].
fn fault_pe(rank: usize, name: &str) -> Result<(), String> {
    let scratch = std::path::PathBuf::from(std::env::var("SHMEM_TEST_SCRATCH").map_err(|_| "no SHMEM_TEST_SCRATCH")?);
    let killed_at = scratch.join("killed_at");
    let victim: usize = std::env::var(VICTIM_VAR)
        .ok()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("no PE number in {VICTIM_VAR}"))?;
    let ctx = shmem::init().map_err(|e| e.to_string())?;
    let gpu = ctx.backend() == shmem::BackendKind::Gpu;
    // Emulated nodes hold consecutive PEs, node j named `node<j>` (see
    // `Launch::nodes`).
    let victim_node = victim / ctx.local_size();
    let same_node = rank / ctx.local_size() == victim_node;
    let fault = {
        let op = fault_op(&ctx, name).map_err(|e| format!("setting up: {e}"))?;
        ctx.barrier_all(&ctx.stream()).map_err(|e| e.to_string())?;
        if rank == victim {
            std::thread::spawn(move || {
                std::thread::sleep(KILL_AFTER);
                // Written before the kill, so the survivors' times since it
                // err on the long side.
                let _ = std::fs::write(&killed_at, unix_micros().to_string());
                // SAFETY: kill(2) on this very process; nothing to uphold.
                unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
            });
            loop {
                op().map_err(|e| format!("the victim's operation failed before it was killed: {e}"))?;
            }
        }
        let bound = Duration::from_secs(FAULT_WAIT_TIMEOUT_S) + if gpu { DEVICE_GIVE_UP } else { Duration::ZERO };
        let looping = Instant::now();
        let give_up = KILL_AFTER + bound + Duration::from_secs(10);
        loop {
            let started = Instant::now();
            match op() {
                Ok(()) if looping.elapsed() < give_up => {}
                Ok(()) => return Err(format!("the operation still succeeds {give_up:?} into the loop")),
                Err(e) => break (e, started.elapsed(), bound),
            }
        }
        // The buffers and the context go here, so that this PE's peers
        // see it leave rather than die.
    };
    drop(ctx);
    let (err, in_call, bound) = fault;
    let since_kill = std::fs::read_to_string(&killed_at)
        .ok()
        .and_then(|t| t.trim().parse::<u128>().ok())
        .map(|t| Duration::from_micros(unix_micros().saturating_sub(t) as u64))
        .ok_or_else(|| format!("failed with no record of the kill: {err}"))?;
    eprintln!("PE {rank} failed {since_kill:?} after PE {victim}'s kill ({in_call:?} into the call): {err}");
    let expected = match &err {
        // A PE of another node learns of the death from the launcher, and
        // names the victim's node.
        Error::PeerLost { pe, what } => {
            *pe == victim
                && what.starts_with("died")
                && (same_node || what.starts_with(&format!("died on node node{victim_node} ")))
        }
        Error::Cuda(_) | Error::Timeout { .. } => gpu,
        _ => false,
    };
    if !expected {
        return Err(format!("wrong error: {err}"));
    }
    if since_kill > bound {
        return Err(format!("the error came {since_kill:?} after the kill, more than {bound:?}"));
    }
    std::process::exit(SAW_FAULT)
}

/// One call of the scenario's operation (with its stream synchronised, so
/// the GPU backend's device work is part of it), on buffers made here.
fn fault_op<'a>(ctx: &'a shmem::Context, name: &str) -> shmem::Result<Box<dyn Fn() -> shmem::Result<()> + 'a>> {
    let s = ctx.stream();
    let (n, me) = (ctx.n_pes(), ctx.my_pe());
    Ok(match name {
        "sigkill_in_barrier" => Box::new(move || ctx.barrier_all(&s).and_then(|()| s.synchronize())),
        "sigkill_in_all_reduce" => {
            // 4 MiB: the two-shot path, with a barrier between its halves.
            let len = 1 << 20;
            let src = ctx.alloc::<f32>(len)?;
            src.copy_from_host(&(0..len).map(|i| (me * len + i) as f32).collect::<Vec<_>>(), &s)?;
            let dst = ctx.alloc_zeroed::<f32>(len)?;
            Box::new(move || ctx.all_reduce(&dst, &src, ReduceOp::Sum, &s).and_then(|()| s.synchronize()))
        }
        "sigkill_in_dispatch_2d" => {
            // Every PE sends `rows` rows of 4 KiB to each expert of every PE.
            let (ne, rows, row_len, align) = (2, 32, 1024, 8);
            let input = ctx.alloc::<f32>(n * ne * rows * row_len)?;
            input.copy_from_host(&(0..input.len()).map(|i| (me << 24 | i) as f32).collect::<Vec<_>>(), &s)?;
            let splits = ctx.alloc::<i64>(n * ne)?;
            splits.copy_from_host(&vec![rows as i64; n * ne], &s)?;
            let out_rows = ne * (n * rows).next_multiple_of(align);
            let output = ctx.alloc_zeroed::<f32>(out_rows * row_len)?;
            let so = ctx.alloc_zeroed::<i64>(2 * n * ne)?;
            Box::new(move || {
                ctx.all_to_all_v_2d(&input, &output, &splits, &so, row_len, align, &s).and_then(|()| s.synchronize())
            })
        }
        other => return Err(Error::Invalid(format!("no fault scenario {other:?}"))),
    })
}
