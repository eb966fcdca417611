//! The suite's driver: started with no launcher, the test binary starts
//! itself as the PEs of each world it runs and sums up their reports.
//!
//! A world starts one of two ways:
//! - by shmem's own launcher ([`Launch`]), once for each world of
//!   `SHMEM_TEST_WORLDS` (1–4 PEs by default), each on `SHMEM_TEST_NODES`
//!   emulated nodes;
//! - by the command in `SHMEM_TEST_LAUNCHER` (`srun -N 2 --ntasks-per-node
//!   4`, `mpirun -np 8 --hostfile hosts`), once: that launcher decides how
//!   many PEs there are and where they run. The driver runs `<launcher
//!   words> env K=V … <this binary> <its arguments>`, the `env` passing the
//!   suite's settings on (see [`forwarded_env`]) in the same way under
//!   every launcher.
//!
//! Either way PE 0 writes its counts to the file that `SHMEM_TEST_REPORT`
//! names, in the temporary directory (`TMPDIR`); where a launcher starts
//! PE 0 on another machine, `TMPDIR` must name a directory both see.

use shmem::bootstrap::env as launcher_env;
use shmem::launch::{describe_status, Launch};
use std::ffi::OsString;
use std::fmt;
use std::path::Path;
use std::process::{Command, ExitCode};
use std::time::Instant;

/// Where PE 0 writes its counts (set by the driver for the PEs).
const REPORT: &str = "SHMEM_TEST_REPORT";
/// The command that starts the suite's one world instead of [`Launch`].
const LAUNCHER: &str = "SHMEM_TEST_LAUNCHER";

/// PE 0 writes the counts for the driver that launched it.
pub fn write_report(me: usize, c: &libtest_mimic::Conclusion) {
    if me != 0 {
        return;
    }
    if let Ok(path) = std::env::var(REPORT) {
        let line = format!("{} {} {} {}\n", c.num_passed, c.num_failed, c.num_ignored, c.num_filtered_out);
        if let Err(e) = std::fs::write(&path, line) {
            eprintln!("[pe 0] could not write the suite's report to {path}: {e}");
        }
    }
}

/// One world that the driver starts.
enum World {
    /// `pes` PEs on `nodes` emulated nodes of this machine, by [`Launch`].
    Own { pes: usize, nodes: usize },
    /// The PEs that this launcher command (split into words) starts.
    Launcher(Vec<String>),
}

impl fmt::Display for World {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            World::Own { pes, nodes } => write!(f, "{pes} PE(s), {nodes} node(s)"),
            World::Launcher(words) => write!(f, "the PEs that `{}` starts", words.join(" ")),
        }
    }
}

impl World {
    /// Starts the world's PEs as this binary with `args`, PE 0 reporting to
    /// `report`, and waits for them: whether they all succeeded and how
    /// the world ended, in words, or why it could not start.
    fn run(&self, exe: &Path, args: &[String], report: &Path) -> Result<(bool, String), String> {
        match self {
            World::Own { pes, nodes } => {
                let outcome = Launch::new(*pes, exe)
                    .nodes(*nodes)
                    .args(args)
                    .env(REPORT, report)
                    .run()
                    .map_err(|e| format!("could not launch: {e}"))?;
                let code = outcome.exit_code();
                Ok((code == 0, format!("exit code {code}: {outcome}")))
            }
            World::Launcher(words) => {
                let mut cmd = Command::new(&words[0]);
                cmd.args(&words[1..]).arg("env");
                for (k, v) in forwarded_env(report) {
                    let mut kv = k;
                    kv.push("=");
                    kv.push(v);
                    cmd.arg(kv);
                }
                cmd.arg(exe).args(args);
                println!("SPMD suite: {cmd:?}");
                let status = cmd.status().map_err(|e| {
                    format!("could not start the launcher {:?} ({LAUNCHER}={:?}): {e}", words[0], words.join(" "))
                })?;
                Ok((status.success(), format!("the launcher {}", describe_status(status))))
            }
        }
    }
}

/// What the PEs that a launcher starts get through `env`: the report file,
/// and this process's shmem and NVSHMEM settings (`SHMEM_*`, the suite's
/// own such as `SHMEM_TEST_SEED` among them, and `NVSHMEM_*`), which
/// launchers pass on to other machines each in its own way, if at all.
/// Left out: what a launcher sets for each PE (`SHMEM_RANK` and the rest of
/// [`launcher_env`]) and `SHMEM_NODE_ID`, as the PEs' nodes are the
/// launcher's to give.
fn forwarded_env(report: &Path) -> Vec<(OsString, OsString)> {
    use launcher_env::*;
    let per_pe = [RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_SIZE, NODE_ID, RENDEZVOUS, RENDEZVOUS_TOKEN, REPORT, LAUNCHER];
    let mut vars: Vec<(OsString, OsString)> = std::env::vars_os()
        .filter(|(k, _)| {
            k.to_str().is_some_and(|k| (k.starts_with("SHMEM_") || k.starts_with("NVSHMEM_")) && !per_pe.contains(&k))
        })
        .collect();
    vars.sort();
    vars.push((REPORT.into(), report.into()));
    vars
}

/// `SHMEM_TEST_LAUNCHER` split into words on whitespace, or `None` where it
/// is unset or blank. There is no quoting: a quote or a backslash is an
/// error rather than a word that means something else than it says.
fn launcher_words() -> Result<Option<Vec<String>>, String> {
    let v = match std::env::var(LAUNCHER) {
        Ok(v) => v,
        Err(std::env::VarError::NotPresent) => return Ok(None),
        Err(std::env::VarError::NotUnicode(v)) => return Err(format!("{LAUNCHER}={v:?}: not UTF-8")),
    };
    if v.contains(['"', '\'', '\\']) {
        return Err(format!(
            "{LAUNCHER}={v:?}: quoting is not supported (the command is split on whitespace; \
             a word with spaces needs a wrapper script)"
        ));
    }
    let words: Vec<String> = v.split_whitespace().map(String::from).collect();
    Ok((!words.is_empty()).then_some(words))
}

/// The worlds to run: the launcher's one, or shmem's own launches of
/// `SHMEM_TEST_WORLDS` on `SHMEM_TEST_NODES` nodes. Prints the worlds it
/// leaves out and why; fails on a setting it cannot read.
fn plan() -> Result<Vec<World>, String> {
    if let Some(words) = launcher_words()? {
        for var in ["SHMEM_TEST_WORLDS", "SHMEM_TEST_NODES"] {
            if std::env::var_os(var).is_some_and(|v| !v.is_empty()) {
                return Err(format!(
                    "{var} does not apply with {LAUNCHER}: the launcher decides the PEs and their nodes \
                     (emulated nodes under a launcher: give each rank its SHMEM_NODE_ID through it)"
                ));
            }
        }
        return Ok(vec![World::Launcher(words)]);
    }
    let nodes: usize = match std::env::var("SHMEM_TEST_NODES") {
        Err(_) => 1,
        Ok(v) => match v.trim().parse() {
            Ok(k) if k >= 1 => k,
            _ => return Err(format!("SHMEM_TEST_NODES={v:?}: not a number of nodes (1 or more)")),
        },
    };
    // By default 1 to 4 PEs, as many as the machine takes (one per GPU on
    // the gpu backend).
    let worlds: Vec<usize> = std::env::var("SHMEM_TEST_WORLDS")
        .ok()
        .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect::<Vec<usize>>())
        .unwrap_or_else(|| {
            let most = shmem::launch::machine_pes().unwrap_or(4).clamp(1, 4);
            if most < 4 {
                println!("SPMD suite: worlds of 1 to {most} PE(s), one per GPU (SHMEM_TEST_WORLDS to choose)");
            }
            (1..=most).collect()
        });
    Ok(worlds
        .into_iter()
        .filter(|&n| {
            let fits = n % nodes == 0;
            if !fits {
                println!("SPMD suite: skipping the world of {n} PE(s), which {nodes} nodes do not divide");
            }
            fits
        })
        .map(|pes| World::Own { pes, nodes })
        .collect())
}

/// Runs this test binary on worlds of 1–4 PEs (or `SHMEM_TEST_WORLDS`), or
/// on the one world of `SHMEM_TEST_LAUNCHER`, and prints one libtest-style
/// summary of them all. With `SHMEM_TEST_NODES=k` each world runs on `k`
/// emulated nodes; worlds that `k` does not divide are skipped, and the
/// default worlds are the multiples of `k` up to 4.
pub fn launch_worlds() -> ExitCode {
    let worlds = match plan() {
        Ok(w) => w,
        Err(msg) => {
            println!("SPMD suite: {msg}");
            return ExitCode::FAILURE;
        }
    };
    let over = match worlds.first() {
        Some(launcher @ World::Launcher(_)) => format!("on {launcher}"),
        _ => {
            let sizes: Vec<usize> =
                worlds.iter().filter_map(|w| if let World::Own { pes, .. } = w { Some(*pes) } else { None }).collect();
            format!("over worlds {sizes:?}")
        }
    };
    let exe = std::env::current_exe().expect("the test binary's path");
    let args: Vec<String> = std::env::args().skip(1).collect();
    let start = Instant::now();
    let dir = std::env::temp_dir().join(format!("shmem-spmd-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let (mut passed, mut failed, mut ignored, mut filtered) = (0u64, 0u64, 0u64, 0u64);
    let mut bad_worlds = Vec::new();
    for (i, world) in worlds.iter().enumerate() {
        println!("\n==== SPMD suite on {world} ====");
        let report = dir.join(format!("report-{i}"));
        let _ = std::fs::remove_file(&report);
        let ended = world.run(&exe, &args, &report);
        let counts = std::fs::read_to_string(&report).ok().and_then(|s| {
            let v: Vec<u64> = s.split_whitespace().filter_map(|x| x.parse().ok()).collect();
            (v.len() == 4).then_some(v)
        });
        match (ended, counts) {
            (Ok((succeeded, how)), Some(v)) => {
                passed += v[0];
                failed += v[1];
                ignored += v[2];
                filtered += v[3];
                if !succeeded {
                    bad_worlds.push(format!("{world}: {how}"));
                }
            }
            (Ok((_, how)), None) => {
                let hint = match world {
                    World::Own { .. } => String::new(),
                    World::Launcher(_) => format!(
                        "; did the launcher start the suite's PEs, and can PE 0 write {} \
                         (TMPDIR names the directory)?",
                        report.display()
                    ),
                };
                bad_worlds.push(format!("{world}: no report from PE 0 ({how}){hint}"));
            }
            (Err(e), _) => bad_worlds.push(format!("{world}: {e}")),
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let ok = failed == 0 && bad_worlds.is_empty();
    println!("\n==== SPMD suite {over} ====");
    for b in &bad_worlds {
        println!("world failed: {b}");
    }
    if !ok && failed == 0 {
        failed = bad_worlds.len() as u64;
    }
    println!(
        "test result: {}. {passed} passed; {failed} failed; {ignored} ignored; 0 measured; {filtered} filtered out; finished in {:.2}s",
        if ok { "ok" } else { "FAILED" },
        start.elapsed().as_secs_f64()
    );
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
