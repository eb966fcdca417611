//! How a PE's process ended, in words, for the launcher's reports and the
//! rendezvous server's news of a PE that is gone.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

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
