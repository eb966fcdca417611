//! Multi-process scenarios that a test launches as a job of its own: a PE
//! that dies, a PE that never starts, mismatched start-up settings, and use
//! after finalize. The tests run in the 1-PE world (each launches its own
//! job; running them from every world would only repeat them).

use crate::util::{Env, TestResult};
use crate::TestFn;
use shmem::launch::Launch;
use shmem::{Error, ReduceOp};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

pub const TESTS: &[(&str, TestFn)] = &[
    ("scenario::dead_pe_fails_barrier_waiters", dead_pe_fails_barrier_waiters),
    ("scenario::dead_pe_fails_signal_waiters", dead_pe_fails_signal_waiters),
    ("scenario::pe_that_never_starts", pe_that_never_starts),
    ("scenario::launcher_ends_job_when_a_pe_fails", launcher_ends_job_when_a_pe_fails),
    ("scenario::heap_size_differs", heap_size_differs),
    ("scenario::use_after_finalize_and_foreign", use_after_finalize_and_foreign),
    ("scenario::collectives_on_different_teams", collectives_on_different_teams),
];

/// Exit code of a scenario PE that saw what it should.
const SAW_IT: u8 = 0;
/// Exit code of a PE that is told to die.
const DIES: i32 = 3;
/// Exit code of a PE that saw its peer leave after the peer found the fault.
const PEER_LEFT: i32 = 4;

/// The outcome of launching scenario `name` on `n` PEs.
fn launch(name: &str, n: usize, kill_on_failure: bool, env: &[(&str, &str)]) -> (shmem::launch::Outcome, Duration) {
    let exe = std::env::current_exe().unwrap();
    let mut l = Launch::new(n, exe).env("SHMEM_TEST_SCENARIO", name).kill_on_failure(kill_on_failure).tag_output(true);
    for (k, v) in env {
        l = l.env(k, v);
    }
    let start = Instant::now();
    let outcome = l.run().expect("launching the scenario");
    (outcome, start.elapsed())
}

/// Each PE's exit code (-1 for a PE killed by a signal).
fn exit_codes(o: &shmem::launch::Outcome) -> Vec<i32> {
    o.statuses.iter().map(|s| s.code().unwrap_or(-1)).collect()
}

fn only_in_one_pe_world(env: &Env) -> bool {
    env.n() == 1
}

fn dead_pe_fails_barrier_waiters(env: &Env) -> TestResult {
    if !only_in_one_pe_world(env) {
        return Ok(());
    }
    let (o, took) = launch("die_then_barrier", 3, false, &[]);
    assert!(took < Duration::from_secs(30), "took {took:?}");
    let codes = exit_codes(&o);
    assert_eq!(codes, vec![SAW_IT as i32, SAW_IT as i32, DIES], "PE exit codes");
    Ok(())
}

fn dead_pe_fails_signal_waiters(env: &Env) -> TestResult {
    if !only_in_one_pe_world(env) {
        return Ok(());
    }
    let (o, took) = launch("die_then_signal_wait", 2, false, &[]);
    assert!(took < Duration::from_secs(30), "took {took:?}");
    assert_eq!(exit_codes(&o), vec![SAW_IT as i32, DIES]);
    Ok(())
}

fn pe_that_never_starts(env: &Env) -> TestResult {
    if !only_in_one_pe_world(env) {
        return Ok(());
    }
    let (o, took) = launch("never_start", 3, false, &[("SHMEM_PEER_TIMEOUT", "2")]);
    assert!(took < Duration::from_secs(20), "took {took:?}");
    assert_eq!(exit_codes(&o), vec![SAW_IT as i32, DIES, SAW_IT as i32]);
    Ok(())
}

fn launcher_ends_job_when_a_pe_fails(env: &Env) -> TestResult {
    if !only_in_one_pe_world(env) {
        return Ok(());
    }
    // PE 2 fails at once; the others would wait for it for ever in init (no
    // peer timeout): the launcher must end them and report PE 2's status.
    let (o, took) = launch("never_start_no_timeout", 4, true, &[("SHMEM_PEER_TIMEOUT", "3600")]);
    assert!(took < Duration::from_secs(30), "took {took:?}");
    assert_eq!(o.exit_code(), DIES);
    Ok(())
}

fn heap_size_differs(env: &Env) -> TestResult {
    if !only_in_one_pe_world(env) {
        return Ok(());
    }
    let (o, _) = launch("heap_size_differs", 2, false, &[]);
    assert_eq!(exit_codes(&o), vec![SAW_IT as i32; 2]);
    Ok(())
}

fn use_after_finalize_and_foreign(env: &Env) -> TestResult {
    if !only_in_one_pe_world(env) {
        return Ok(());
    }
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
    if !only_in_one_pe_world(env) {
        return Ok(());
    }
    // PE 0 enters a barrier of a sub-team, PE 1 one of the world: neither
    // can go on; both must say so, quickly, instead of hanging.
    // The first to notice says "collective mismatch"; the other may instead
    // see that PE leave (PEER_LEFT) — a clear error either way.
    let (o, took) = launch("different_teams", 2, false, &[]);
    assert!(took < Duration::from_secs(20), "took {took:?}");
    let codes = exit_codes(&o);
    assert!(codes.iter().all(|&c| c == SAW_IT as i32 || c == PEER_LEFT), "PE exit codes {codes:?}");
    assert!(codes.contains(&(SAW_IT as i32)), "nobody reported the mismatch: {codes:?}");
    Ok(())
}

/// Runs scenario `name` as this PE.
pub fn run(name: &str) -> ExitCode {
    let rank: usize = std::env::var("SHMEM_RANK").ok().and_then(|r| r.parse().ok()).unwrap_or(0);
    let result = match name {
        "die_then_barrier" => die_then(rank, 2, |ctx| ctx.barrier_all(&ctx.stream())),
        "die_then_signal_wait" => die_then(rank, 1, |ctx| {
            let sig = ctx.alloc_zeroed::<u64>(1)?;
            ctx.barrier_all(&ctx.stream())?;
            ctx.signal_wait_until(&sig, 0, shmem::Cmp::Ge, 1, &ctx.stream()).map(drop)
        }),
        "never_start" | "never_start_no_timeout" => never_start(rank),
        "heap_size_differs" => heap_size_differs_pe(rank),
        "lifecycle" => lifecycle(),
        "different_teams" => different_teams(rank),
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
    match then(&ctx) {
        Err(Error::PeerLost { pe, what }) if pe == victim => {
            eprintln!("PE {rank} saw, after {:?}: PE {pe} {what}", start.elapsed());
            Ok(())
        }
        Err(e) => Err(format!("wrong error: {e}")),
        Ok(()) => Err("the operation succeeded with a dead peer".into()),
    }
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
    let r = if rank == 0 { team.barrier(&s) } else { world.barrier(&s) };
    match r {
        Err(Error::CollectiveMismatch(msg)) => {
            eprintln!("PE {rank} saw: {msg}");
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
