//! The SPMD test suite: one list of tests that every PE runs in the same
//! order, on whatever world it is given.
//!
//! - Started by `cargo test` (no launcher): relaunches itself with 1, 2, 3
//!   and 4 PEs (`SHMEM_TEST_WORLDS=2,4` to choose; `SHMEM_TEST_NODES=2`
//!   splits each world into 2 emulated nodes) and sums the results.
//! - `SHMEM_TEST_LAUNCHER="srun -N 2 --ntasks-per-node 4"` (or `mpirun -np
//!   8 --hostfile hosts`, `shmemrun -n 4`): relaunches itself through that
//!   command instead, once, on the world the launcher gives, as
//!   `<launcher words> env SHMEM_…=… <this binary> <its arguments>`: the
//!   `env` passes the suite's and shmem's settings (`SHMEM_*`,
//!   `NVSHMEM_*`) to every PE, whatever the launcher forwards by itself.
//!   The command is split on whitespace, with no quoting (a quote or a
//!   backslash is refused). The launcher places the PEs, so
//!   `SHMEM_TEST_WORLDS` and `SHMEM_TEST_NODES` do not apply. PEs started
//!   by `mpirun`/`srun` need the `mpi` feature. PE 0 writes its counts
//!   under `TMPDIR`, which must be shared where PE 0 runs on another
//!   machine. See `driver.rs`.
//! - Started by `shmemrun` or `mpirun`: runs on that world; only PE 0
//!   prints the libtest report, and a test fails when it fails on any PE.
//!   A test that does not apply to the run (the gpu backend's, on the host
//!   backend; one that needs more PEs) is reported as ignored, with why:
//!   `test coll::graph_replay_gpu_only ... ignored (needs the gpu backend;
//!   this run is on the host backend)`.
//! - `SHMEM_TEST_SCENARIO=name`: one of the multi-process scenarios that
//!   tests launch themselves (dead PEs, start-up errors, finalize).
//! - `SHMEM_TEST_DTYPES=f32,bf16,i64` narrows the per-dtype tests to those
//!   element types, `SHMEM_TEST_HUGE=0` leaves out the collectives'
//!   256 MiB cases and `SHMEM_TEST_REPLAYS=n` replays the captured graphs
//!   n times instead of 1000: for the sanitizers' runs on the box
//!   (`ci/gpu-run.sh --sanitize`), which cannot afford the whole matrix.

mod bytes;
mod coll;
mod deferred;
mod driver;
mod errors;
mod kernels;
mod moe;
mod nodes;
mod overlap;
mod rma;
mod scenarios;
mod teams;
mod util;

use libtest_mimic::{Arguments, Completion, Failed, Trial};
use std::cell::RefCell;
use std::process::ExitCode;
use util::Env;

/// A test body; every PE runs it. Errors and panics fail the test, but for
/// [`util::NotApplicable`], which makes it ignored.
pub type TestFn = fn(&Env) -> util::TestResult;

/// A test of the suite: its name and its body, a fixed function or one
/// of a generated matrix (`coll::tests`).
pub struct Test {
    pub name: String,
    pub body: Box<dyn Fn(&Env) -> util::TestResult + Send + Sync>,
}

impl Test {
    pub fn new(name: String, body: impl Fn(&Env) -> util::TestResult + Send + Sync + 'static) -> Test {
        Test { name, body: Box::new(body) }
    }
}

fn all_tests() -> Vec<Test> {
    let fixed = |list: &[(&str, TestFn)]| -> Vec<Test> {
        list.iter().map(|&(name, f)| Test::new(name.to_string(), f)).collect()
    };
    let mut t = fixed(rma::TESTS);
    t.extend(fixed(bytes::TESTS));
    t.extend(coll::tests());
    t.extend(fixed(teams::TESTS));
    t.extend(fixed(errors::TESTS));
    t.extend(fixed(deferred::TESTS));
    t.extend(fixed(moe::TESTS));
    t.extend(fixed(moe::fp8::TESTS));
    t.extend(fixed(moe::arrivals::TESTS));
    t.extend(fixed(nodes::TESTS));
    t.extend(fixed(overlap::TESTS));
    t.extend(fixed(scenarios::TESTS));
    t
}

thread_local! {
    static ENV: RefCell<Option<Env>> = const { RefCell::new(None) };
    static BROKEN: RefCell<Option<String>> = const { RefCell::new(None) };
}

fn main() -> ExitCode {
    if let Ok(name) = std::env::var("SHMEM_TEST_SCENARIO") {
        return scenarios::run(&name);
    }
    let mut args = Arguments::from_args();
    if args.list {
        let trials = all_tests().into_iter().map(|t| Trial::test(t.name, || Ok(()))).collect();
        let _ = libtest_mimic::run(&args, trials);
        return ExitCode::SUCCESS;
    }
    if !shmem::bootstrap::started_by_launcher() {
        return driver::launch_worlds();
    }
    args.test_threads = Some(1); // every PE runs the tests in the same order
    let wait_timeout = match util::suite_wait_timeout() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let ctx = match shmem::Config::new().wait_timeout(Some(wait_timeout)).init() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("shmem init failed: {e}");
            return ExitCode::FAILURE;
        }
    };
    let me = ctx.my_pe();
    if me != 0 {
        util::silence_stdout();
    }
    let env = match Env::new(ctx) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("[pe {me}] setting up the suite failed: {e}");
            return ExitCode::FAILURE;
        }
    };
    ENV.with(|slot| *slot.borrow_mut() = Some(env));
    let trials = all_tests()
        .into_iter()
        .map(|Test { name, body }| {
            let trial_name = name.clone();
            Trial::ignorable_test(trial_name, move || {
                ENV.with(|e| run_one(&name, &*body, e.borrow().as_ref().unwrap()))
            })
        })
        .collect();
    let conclusion = libtest_mimic::run(&args, trials);
    driver::write_report(me, &conclusion);
    let env = ENV.with(|slot| slot.borrow_mut().take()).unwrap();
    let finalized = env.finish();
    if let Err(e) = &finalized {
        eprintln!("[pe {me}] finalize failed: {e}");
    }
    if conclusion.has_failed() || finalized.is_err() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// What a test did on one PE, as the word the PEs agree on.
const PASSED: u32 = 0;
const FAILED: u32 = 1;
const NOT_APPLICABLE: u32 = 2;

/// Runs `body` on this PE, then agrees with every PE on the outcome: it
/// failed if it failed on any PE, and is ignored (with the reason) if it
/// did not apply on every PE.
fn run_one(name: &str, body: &dyn Fn(&Env) -> util::TestResult, env: &Env) -> Result<Completion, Failed> {
    if let Some(why) = BROKEN.with(|b| b.borrow().clone()) {
        return Err(format!("not run: {why}").into());
    }
    let me = env.ctx.my_pe();
    let outcome = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(env))) {
        Ok(Ok(())) => Ok(None),
        Ok(Err(e)) => match e.downcast::<util::NotApplicable>() {
            Ok(why) => Ok(Some(why.0)),
            Err(e) => Err(format!("error: {e}")),
        },
        Err(panic) => Err(panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .map_or("panicked".into(), |m| format!("panicked: {m}"))),
    };
    if let Err(msg) = &outcome {
        eprintln!("[pe {me}] {name}: {msg}");
    }
    let word = match &outcome {
        Ok(None) => PASSED,
        Err(_) => FAILED,
        Ok(Some(_)) => NOT_APPLICABLE,
    };
    // Agree on the outcome over a team of its own, so the world team's
    // state does not matter here.
    let words = match env.agree(word) {
        Ok(words) => words,
        Err(e) => {
            let why = format!("the PEs could not agree on the outcome of {name}: {e}");
            BROKEN.with(|b| *b.borrow_mut() = Some(why.clone()));
            return Err(why.into());
        }
    };
    let on = |w: u32| -> Vec<usize> { (0..words.len()).filter(|&pe| words[pe] == w).collect() };
    let (failed_on, skipped_on) = (on(FAILED), on(NOT_APPLICABLE));
    if failed_on.is_empty() && skipped_on.is_empty() {
        return Ok(Completion::Completed);
    }
    if failed_on.is_empty() && skipped_on.len() == words.len() {
        // Every PE returned before anything collective.
        return Ok(Completion::ignored_with(outcome.ok().flatten().unwrap_or_default()));
    }
    // A test that failed part-way, or ran on some PEs only, may have left
    // the PEs at different points of a collective; the rest of the run
    // would only report echoes.
    BROKEN.with(|b| *b.borrow_mut() = Some(format!("{name} failed before it")));
    if failed_on.is_empty() {
        let why = outcome.ok().flatten().map_or(String::new(), |w| format!(" ({w})"));
        return Err(format!("did not apply on PE(s) {skipped_on:?} only{why}").into());
    }
    let mine = outcome.err().map_or(String::new(), |m| format!("; on PE {me}: {m}"));
    Err(format!("failed on PE(s) {failed_on:?}{mine}").into())
}
