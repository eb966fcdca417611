//! Passing the terminal's signals on to the PEs ([`Launch::forward_signals`]).
//!
//! Each PE runs in its own process group, so Ctrl-C at the terminal reaches
//! only the launcher. While [`Launch::run`] waits, a handler counts SIGINT,
//! SIGTERM and SIGHUP, and the wait loop sends each PE what arrived: the
//! first signal as is, any later one as SIGKILL.
//!
//! [`Launch::forward_signals`]: super::Launch::forward_signals
//! [`Launch::run`]: super::Launch::run

use super::lock;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// The signals passed on to the PEs.
const FORWARDED: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];
/// How often each of [`FORWARDED`] arrived since the process started.
static RECEIVED: [AtomicUsize; 3] = [AtomicUsize::new(0), AtomicUsize::new(0), AtomicUsize::new(0)];
/// How many runs forward signals now, and the handlers they replaced.
static INSTALLED: Mutex<(usize, Vec<(libc::c_int, libc::sigaction)>)> = Mutex::new((0, Vec::new()));

extern "C" fn note_signal(sig: libc::c_int) {
    // Only an atomic add: async-signal-safe.
    if let Some(i) = FORWARDED.iter().position(|&s| s == sig) {
        RECEIVED[i].fetch_add(1, Ordering::Relaxed);
    }
}

/// One run's share of the signal handlers; restores the old ones when the
/// last run ends.
pub(super) struct SignalForwarding {
    seen: [usize; 3],
    forwarded_any: bool,
}

impl SignalForwarding {
    pub(super) fn install() -> io::Result<SignalForwarding> {
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
    pub(super) fn take_pending(&mut self) -> Vec<libc::c_int> {
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
