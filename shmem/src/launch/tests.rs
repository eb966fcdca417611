//! The launcher's tests: jobs of `sh -c` scripts, and of this test binary
//! itself acting as PEs of a rendezvous.

use super::*;
use crate::bootstrap::relay::Incoming;
use crate::bootstrap::tcp::Client;
use std::collections::HashMap;
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
fn failed_job_removes_every_pes_leftovers() {
    if !Path::new("/dev/shm").is_dir() {
        eprintln!("skipped: no /dev/shm");
        return;
    }
    // With emulated nodes each node's first PE makes an object: PE 2 leaves
    // one and fails the job, PE 1 leaves one and waits to be stopped.
    let script = r#"case "$SHMEM_RANK" in
          0) sleep 100 ;;
          1) : > /dev/shm/shmem-$$-a1; echo $$ > "$DIR/1"; sleep 100 ;;
          2) : > /dev/shm/shmem-$$-b2; echo $$ > "$DIR/2"; sleep 0.3; exit 4 ;;
        esac"#;
    let dir = std::env::temp_dir().join(format!("shmem-launch-leftovers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = sh(3, script).env("DIR", &dir).run().unwrap();
    assert_eq!(out.first_failure.map(|(r, s)| (r, s.code())), Some((2, Some(4))));
    for (rank, suffix) in [(1, "a1"), (2, "b2")] {
        let pid = std::fs::read_to_string(dir.join(rank.to_string())).unwrap().trim().to_string();
        assert_eq!(pid, out.pids[rank].to_string());
        assert!(!Path::new(&format!("/dev/shm/shmem-{pid}-{suffix}")).exists(), "PE {rank}'s leftover was removed");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The variables `launch` sets (`Some`) or removes (`None`) for PE `rank`.
fn vars_of(launch: &Launch, rank: usize) -> HashMap<String, Option<String>> {
    let addr: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let cmd = launch.command(rank, addr, Token([1; 16]));
    let text = |s: &OsStr| s.to_str().unwrap().to_string();
    cmd.get_envs().map(|(k, v)| (text(k), v.map(text))).collect()
}

#[test]
fn each_pe_is_told_its_node() {
    let some = |s: &str| Some(Some(s.to_string()));
    let mnnvl_inherited = std::env::var_os(DISABLE_MNNVL).is_some();
    let nodes = Launch::new(6, "prog").nodes(3);
    for rank in 0..6 {
        let v = vars_of(&nodes, rank);
        assert_eq!(v.get("SHMEM_RANK"), some(&rank.to_string()).as_ref());
        assert_eq!(v.get("SHMEM_WORLD_SIZE"), some("6").as_ref());
        assert_eq!(v.get("SHMEM_NODE_ID"), some(&format!("node{}", rank / 2)).as_ref(), "PE {rank}");
        assert_eq!(v.get("SHMEM_LOCAL_RANK"), some(&(rank % 2).to_string()).as_ref(), "PE {rank}");
        assert_eq!(v.get("SHMEM_LOCAL_SIZE"), some("2").as_ref());
        let mnnvl = if mnnvl_inherited { None } else { some("1") };
        assert_eq!(v.get(DISABLE_MNNVL), mnnvl.as_ref());
    }
    // One node: an inherited node id is removed; the machine is the node.
    let one = Launch::new(3, "prog");
    for rank in 0..3 {
        let v = vars_of(&one, rank);
        assert_eq!(v.get("SHMEM_NODE_ID"), Some(&None), "removed");
        assert_eq!(v.get("SHMEM_LOCAL_RANK"), some(&rank.to_string()).as_ref());
        assert_eq!(v.get("SHMEM_LOCAL_SIZE"), some("3").as_ref());
        assert_eq!(v.get(DISABLE_MNNVL), None);
    }
    // The caller's variables: a node id on one node, NVSHMEM's switch.
    let v = vars_of(&Launch::new(2, "prog").env("SHMEM_NODE_ID", "mine"), 1);
    assert_eq!(v.get("SHMEM_NODE_ID"), some("mine").as_ref());
    let v = vars_of(&Launch::new(2, "prog").nodes(2).env("SHMEM_NODE_ID", "mine").env(DISABLE_MNNVL, "0"), 1);
    assert_eq!(v.get("SHMEM_NODE_ID"), some("node1").as_ref(), "the launcher's own takes precedence");
    assert_eq!(v.get(DISABLE_MNNVL), some("0").as_ref());
}

#[test]
#[cfg_attr(miri, ignore = "Miri: no processes (it starts PEs)")]
fn nodes_must_divide_the_pes() {
    for (n, k) in [(4, 3), (2, 4), (3, 0)] {
        let e = sh(n, "exit 0").nodes(k).run().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        let want = format!("{n} PEs cannot be spread evenly over {k} nodes");
        assert!(e.to_string().contains(&want), "{e}");
    }
    let script = r#"echo "$SHMEM_RANK $SHMEM_NODE_ID $SHMEM_LOCAL_RANK $SHMEM_LOCAL_SIZE""#;
    let (launch, buf) = captured(sh(4, script).nodes(2));
    assert!(launch.run().unwrap().success());
    let text = text(&buf);
    for (rank, want) in ["0 node0 0 2", "1 node0 1 2", "2 node1 0 2", "3 node1 1 2"].iter().enumerate() {
        assert!(text.lines().any(|l| l == format!("[{rank}] {want}")), "{text}");
    }
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
        "relay" => {
            // Everyone greets everyone through the launcher; then PE 1 ends
            // without goodbye, and the others hear that it died.
            let mut c = Client::connect_from_env(timeout).unwrap();
            let n = c.size();
            c.allgather(b"init").unwrap();
            let mut relay = c.into_relay().unwrap();
            for to in (0..n).filter(|&to| to != rank) {
                relay.send(to, format!("hello {to} from {rank}").as_bytes()).unwrap();
            }
            let mut from = Vec::new();
            let mut death = None;
            let deadline = Instant::now() + timeout;
            while from.len() < n - 1 || (rank != 1 && death.is_none()) {
                assert!(Instant::now() < deadline, "PE {rank} has {from:?}, {death:?}");
                for m in relay.poll().unwrap() {
                    match m {
                        Incoming::Message { from: f, body } => {
                            assert_eq!(body, format!("hello {rank} from {f}").as_bytes());
                            from.push(f);
                        }
                        Incoming::Gone { rank: 1, died: true, text } => death = Some(text),
                        other => panic!("PE {rank}: {other:?}"),
                    }
                }
                thread::sleep(Duration::from_millis(1));
            }
            if rank == 1 {
                std::process::exit(7); // no goodbye
            }
            let text = death.unwrap();
            assert!(text.starts_with("PE 1 died (its connection to the launcher closed"), "{text}");
            println!("saw: {text}");
            relay.close();
        }
        "nested" => {
            // A PE that starts a job of its own: its node is not theirs.
            let script = r#"echo "${SHMEM_NODE_ID-none} $SHMEM_LOCAL_RANK $SHMEM_LOCAL_SIZE""#;
            assert_eq!(std::env::var("SHMEM_NODE_ID").unwrap(), format!("node{rank}"));
            let (launch, buf) = captured(sh(2, script));
            assert!(launch.run().unwrap().success());
            let mut lines: Vec<String> = text(&buf).lines().map(str::to_string).collect();
            lines.sort();
            assert_eq!(lines, ["[0] none 0 2", "[1] none 1 2"]);
            println!("nested: ok");
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
    self_launch_on(n, 1, role)
}

fn self_launch_on(n: usize, nodes: usize, role: &str) -> (Outcome, String) {
    let exe = std::env::current_exe().unwrap();
    let launch = Launch::new(n, exe)
        .nodes(nodes)
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
#[cfg_attr(miri, ignore = "Miri: no processes (it starts PEs)")]
fn self_launched_pes_relay_messages_and_news_of_a_death() {
    let (out, text) = self_launch(3, "relay");
    assert_eq!(out.first_failure.map(|(r, s)| (r, s.code())), Some((1, Some(7))), "{text}");
    assert!(out.statuses[0].success() && out.statuses[2].success(), "{text}");
    assert_eq!(text.matches("saw: PE 1 died").count(), 2, "{text}");
}

#[test]
#[cfg_attr(miri, ignore = "Miri: no processes (it starts PEs)")]
fn a_nested_job_is_on_one_node() {
    let (out, text) = self_launch_on(2, 2, "nested");
    assert!(out.success(), "{out}\n{text}");
    assert_eq!(text.matches("nested: ok").count(), 2, "{text}");
}
