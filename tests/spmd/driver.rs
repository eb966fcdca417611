//! The suite's driver: started with no launcher, the test binary starts
//! itself as the PEs of each world it runs and sums up their reports.

use std::process::ExitCode;
use std::time::Instant;

/// PE 0 writes the counts for the driver that launched it.
pub fn write_report(me: usize, c: &libtest_mimic::Conclusion) {
    if me != 0 {
        return;
    }
    if let Ok(path) = std::env::var("SHMEM_TEST_REPORT") {
        let line = format!("{} {} {} {}\n", c.num_passed, c.num_failed, c.num_ignored, c.num_filtered_out);
        let _ = std::fs::write(path, line);
    }
}

/// Runs this test binary on worlds of 1–4 PEs (or `SHMEM_TEST_WORLDS`) and
/// prints one libtest-style summary of them all. With `SHMEM_TEST_NODES=k`
/// each world runs on `k` emulated nodes; worlds that `k` does not divide
/// are skipped, and the default worlds are the multiples of `k` up to 4.
pub fn launch_worlds() -> ExitCode {
    let nodes: usize = match std::env::var("SHMEM_TEST_NODES") {
        Err(_) => 1,
        Ok(v) => match v.trim().parse() {
            Ok(k) if k >= 1 => k,
            _ => {
                println!("SHMEM_TEST_NODES={v:?}: not a number of nodes (1 or more)");
                return ExitCode::FAILURE;
            }
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
        })
        .into_iter()
        .filter(|&n| {
            let fits = n % nodes == 0;
            if !fits {
                println!("SPMD suite: skipping the world of {n} PE(s), which {nodes} nodes do not divide");
            }
            fits
        })
        .collect();
    let exe = std::env::current_exe().expect("the test binary's path");
    let args: Vec<String> = std::env::args().skip(1).collect();
    let start = Instant::now();
    let dir = std::env::temp_dir().join(format!("shmem-spmd-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let (mut passed, mut failed, mut ignored, mut filtered) = (0u64, 0u64, 0u64, 0u64);
    let mut bad_worlds = Vec::new();
    for &n in &worlds {
        println!("\n==== SPMD suite on {n} PE(s), {nodes} node(s) ====");
        let report = dir.join(format!("report-{n}"));
        let _ = std::fs::remove_file(&report);
        let outcome =
            shmem::launch::Launch::new(n, &exe).nodes(nodes).args(&args).env("SHMEM_TEST_REPORT", &report).run();
        let counts = std::fs::read_to_string(&report).ok().and_then(|s| {
            let v: Vec<u64> = s.split_whitespace().filter_map(|x| x.parse().ok()).collect();
            (v.len() == 4).then_some(v)
        });
        match (&outcome, counts) {
            (Ok(o), Some(v)) => {
                passed += v[0];
                failed += v[1];
                ignored += v[2];
                filtered += v[3];
                if o.exit_code() != 0 {
                    bad_worlds.push(format!("{n} PEs: exit code {}", o.exit_code()));
                }
            }
            (Ok(o), None) => bad_worlds.push(format!("{n} PEs: no report (exit code {})", o.exit_code())),
            (Err(e), _) => bad_worlds.push(format!("{n} PEs: could not launch: {e}")),
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let ok = failed == 0 && bad_worlds.is_empty();
    println!("\n==== SPMD suite over worlds {worlds:?} ====");
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
