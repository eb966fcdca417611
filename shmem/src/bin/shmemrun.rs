//! `shmemrun`: starts the PEs of a shmem program on this machine.
//!
//! ```text
//! shmemrun -n 4 [--nodes 2] [--tag-output] [--no-kill] [--] PROG [ARGS...]
//! ```
//!
//! Exits with the first failing PE's exit code (128 + signal if a signal
//! killed it), or 0 if every PE succeeded.

use clap::Parser;
use shmem::launch::Launch;
use std::ffi::OsString;
use std::io::ErrorKind;
use std::process::ExitCode;

/// Start N processing elements (PEs) of a shmem program on this machine.
///
/// Every PE gets SHMEM_RANK, SHMEM_WORLD_SIZE, SHMEM_LOCAL_RANK,
/// SHMEM_LOCAL_SIZE and SHMEM_RENDEZVOUS, the address of the launcher's
/// rendezvous server, through which the PEs find each other and which
/// relays messages between them after start-up if they ask for it.
#[derive(Parser, Debug)]
#[command(name = "shmemrun", version, override_usage = "shmemrun -n N [OPTIONS] [--] PROG [ARGS]...")]
struct Cli {
    /// Number of PEs to start.
    #[arg(short = 'n', long = "np", value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    n_pes: u32,

    /// Emulate K nodes on this machine: PE r is on node r / (N/K), and gets
    /// `SHMEM_NODE_ID=node<j>`, SHMEM_LOCAL_RANK and SHMEM_LOCAL_SIZE by node,
    /// and NVSHMEM_DISABLE_MNNVL=1 unless set. K must divide N. With one
    /// node, an inherited SHMEM_NODE_ID is not passed on.
    #[arg(long, value_name = "K", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    nodes: u32,

    /// Prefix every output line with the rank of the PE that wrote it (`[2] ...`).
    #[arg(short = 'l', long)]
    tag_output: bool,

    /// Keep the other PEs running when one fails.
    #[arg(long)]
    no_kill: bool,

    /// The program to run, then its arguments (which may start with '-').
    #[arg(value_name = "PROG", required = true, num_args = 1.., trailing_var_arg = true)]
    command: Vec<OsString>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let (program, args) = cli.command.split_first().expect("clap requires a program");
    let launch = Launch::new(cli.n_pes as usize, program)
        .nodes(cli.nodes as usize)
        .args(args)
        .tag_output(cli.tag_output)
        .kill_on_failure(!cli.no_kill)
        .forward_signals(true);
    match launch.run() {
        Ok(outcome) => outcome.report("shmemrun"),
        Err(e) => {
            eprintln!("shmemrun: {e}");
            // Shell conventions for a command that cannot be run.
            ExitCode::from(match e.kind() {
                ErrorKind::NotFound => 127,
                ErrorKind::PermissionDenied => 126,
                _ => 1,
            })
        }
    }
}
