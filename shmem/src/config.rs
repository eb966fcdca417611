//! Start-up configuration: a builder, with defaults from the environment.

use crate::error::Result;
use std::ffi::OsString;
use std::time::Duration;

/// Which backend moves the data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// The GPU backend when a CUDA device and NVSHMEM are present, else host.
    Auto,
    /// NVSHMEM and CUDA.
    Gpu,
    /// Processes of one node sharing POSIX shared memory.
    Host,
}

impl BackendKind {
    /// `auto`, `gpu` or `host`, in any case; empty is `auto`.
    fn parse(s: &str) -> Option<BackendKind> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" | "" => Some(BackendKind::Auto),
            "gpu" => Some(BackendKind::Gpu),
            "host" => Some(BackendKind::Host),
            _ => None,
        }
    }
}

/// Default symmetric heap per PE: 256 MiB (raise it with `SHMEM_HEAP_SIZE`).
pub const DEFAULT_HEAP_SIZE: usize = 256 << 20;
/// Default time a PE waits for its peers to join at start-up.
pub const DEFAULT_PEER_TIMEOUT: Duration = Duration::from_secs(30);
/// The heap is a whole number of these.
pub(crate) const PAGE: usize = 4096;

/// How to start shmem. `Config::new()` reads the environment:
///
/// | variable | meaning | default |
/// |---|---|---|
/// | `SHMEM_BACKEND` | `auto`, `gpu` or `host` | `auto` |
/// | `SHMEM_HEAP_SIZE` | symmetric heap per PE, bytes with optional `K`/`M`/`G` | 256M |
/// | `SHMEM_PEER_TIMEOUT` | seconds (more than 0) to wait for peers at start-up | 30 |
/// | `SHMEM_WAIT_TIMEOUT` | seconds any wait may take before failing (`0`: no limit) | no limit |
/// | `SHMEM_FORCE_RMA` | `1`: the GPU kernels reach every peer through NVSHMEM's RMA (`0`: off) | off |
/// | `SHMEM_PES_PER_GPU` | PEs sharing one GPU: node-local PE *i* uses GPU *i* / this (run them under CUDA MPS) | 1 |
///
/// A value that cannot be read fails [`Config::init`] with [`crate::Error::Config`]
/// naming the variable and the value, on every PE of the job (each PE
/// still joins the job to tell the others), before anything is allocated.
/// See docs/env.md for every variable shmem reads.
///
/// A dead peer is noticed within milliseconds whatever the timeouts.
#[derive(Clone, Debug)]
pub struct Config {
    pub(crate) backend: BackendKind,
    pub(crate) heap_size: usize,
    pub(crate) peer_timeout: Duration,
    pub(crate) wait_timeout: Option<Duration>,
    pub(crate) force_rma: bool,
    pub(crate) pes_per_gpu: usize,
    pub(crate) env_error: Option<String>,
}

impl Default for Config {
    fn default() -> Self {
        Self::new()
    }
}

/// Parses `256M`, `1G`, `4096`, `64k`.
pub fn parse_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let (num, mult) = match s.chars().last()?.to_ascii_uppercase() {
        'K' => (&s[..s.len() - 1], 1usize << 10),
        'M' => (&s[..s.len() - 1], 1 << 20),
        'G' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.trim().parse::<usize>().ok()?.checked_mul(mult)
}

/// `bytes` rounded up to whole pages, if the result can be the size of one
/// mapping (at most `isize::MAX`, like any Rust allocation).
pub(crate) fn heap_pages(bytes: usize) -> Option<usize> {
    bytes.checked_next_multiple_of(PAGE).filter(|&b| b <= isize::MAX as usize)
}

/// The environment as [`Config::new`] sees it: one variable's text, `None`
/// when unset, `Err` (with a printable form) when it is not UTF-8.
type Lookup<'a> = &'a dyn Fn(&str) -> Option<OsString>;

fn env_text(get: Lookup, name: &str) -> Result<Option<String>, String> {
    match get(name) {
        None => Ok(None),
        Some(v) => v.into_string().map(Some).map_err(|v| format!("{name}={v:?}: not valid UTF-8")),
    }
}

/// Seconds: a finite, non-negative number that a `Duration` holds.
fn parse_secs(name: &str, v: &str) -> Result<Duration, String> {
    v.trim()
        .parse::<f64>()
        .ok()
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .ok_or_else(|| format!("{name}={v:?}: expected a number of seconds (0 or more, below 1.8e19)"))
}

/// `1`/`true`/`on`/`yes` or `0`/`false`/`off`/`no` (any case); empty is off.
fn parse_switch(name: &str, v: &str) -> Result<bool, String> {
    match v.trim().to_ascii_lowercase().as_str() {
        "" | "0" | "false" | "off" | "no" => Ok(false),
        "1" | "true" | "on" | "yes" => Ok(true),
        _ => Err(format!("{name}={v:?}: expected 1 (on) or 0 (off)")),
    }
}

impl Config {
    /// Defaults, overridden by the `SHMEM_*` environment variables.
    pub fn new() -> Config {
        Self::from_lookup(&|name| std::env::var_os(name))
    }

    /// Defaults, overridden by the variables that `get` finds (the process
    /// environment, or a map in tests). A bad value keeps the default and is
    /// recorded, to fail `init`.
    fn from_lookup(get: Lookup) -> Config {
        let mut c = Config {
            backend: BackendKind::Auto,
            heap_size: DEFAULT_HEAP_SIZE,
            peer_timeout: DEFAULT_PEER_TIMEOUT,
            wait_timeout: None,
            force_rma: false,
            pes_per_gpu: 1,
            env_error: None,
        };
        let mut errors = Vec::new();
        let mut read = |name: &str, apply: &mut dyn FnMut(&str) -> Result<(), String>| match env_text(get, name)
            .and_then(|v| v.map_or(Ok(()), |v| apply(&v)))
        {
            Ok(()) => {}
            Err(e) => errors.push(e),
        };
        read("SHMEM_BACKEND", &mut |v| {
            c.backend =
                BackendKind::parse(v).ok_or_else(|| format!("SHMEM_BACKEND={v:?}: expected auto, gpu or host"))?;
            Ok(())
        });
        read("SHMEM_HEAP_SIZE", &mut |v| {
            let bytes = parse_size(v)
                .ok_or_else(|| format!("SHMEM_HEAP_SIZE={v:?}: expected bytes such as 268435456, 64K, 256M or 2G"))?;
            heap_pages(bytes)
                .ok_or_else(|| format!("SHMEM_HEAP_SIZE={v:?}: {bytes} bytes is more than one mapping can hold"))?;
            c.heap_size = bytes;
            Ok(())
        });
        read("SHMEM_PEER_TIMEOUT", &mut |v| {
            let d = parse_secs("SHMEM_PEER_TIMEOUT", v)?;
            if d.is_zero() {
                return Err(format!("SHMEM_PEER_TIMEOUT={v:?}: the start-up wait must be more than 0 seconds"));
            }
            c.peer_timeout = d;
            Ok(())
        });
        read("SHMEM_WAIT_TIMEOUT", &mut |v| {
            c.wait_timeout = Some(parse_secs("SHMEM_WAIT_TIMEOUT", v)?).filter(|d| !d.is_zero());
            Ok(())
        });
        read("SHMEM_FORCE_RMA", &mut |v| {
            c.force_rma = parse_switch("SHMEM_FORCE_RMA", v)?;
            Ok(())
        });
        read("SHMEM_PES_PER_GPU", &mut |v| {
            c.pes_per_gpu = v
                .trim()
                .parse::<usize>()
                .ok()
                .filter(|&k| k > 0)
                .ok_or_else(|| format!("SHMEM_PES_PER_GPU={v:?}: expected a whole number of PEs, 1 or more"))?;
            Ok(())
        });
        if !errors.is_empty() {
            c.env_error = Some(errors.join("; "));
        }
        c
    }

    /// Bytes of symmetric heap per PE. Must be equal on every PE.
    pub fn heap_size(mut self, bytes: usize) -> Config {
        self.heap_size = bytes;
        self
    }

    /// Which backend to use.
    pub fn backend(mut self, backend: BackendKind) -> Config {
        self.backend = backend;
        self
    }

    /// How long a PE waits for its peers to join at start-up.
    pub fn peer_timeout(mut self, timeout: Duration) -> Config {
        self.peer_timeout = timeout;
        self
    }

    /// The longest any single wait (barrier, signal wait, collective) may
    /// take before it fails with [`crate::Error::Timeout`]; `None` for no limit.
    pub fn wait_timeout(mut self, timeout: Option<Duration>) -> Config {
        self.wait_timeout = timeout;
        self
    }

    /// Starts shmem with this configuration. See [`crate::init`].
    ///
    /// # Collective
    /// Every PE of the job calls it.
    pub fn init(self) -> Result<crate::Context> {
        crate::context::Context::start(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::os::unix::ffi::OsStringExt;

    fn config(vars: &[(&str, &str)]) -> Config {
        let map: HashMap<String, OsString> = vars.iter().map(|(k, v)| (k.to_string(), OsString::from(v))).collect();
        Config::from_lookup(&|name| map.get(name).cloned())
    }

    /// The error that `vars` make, which must name every piece of `want`.
    fn error(vars: &[(&str, &str)], want: &[&str]) {
        let c = config(vars);
        let e = c.env_error.unwrap_or_else(|| panic!("{vars:?} was accepted"));
        for w in want {
            assert!(e.contains(w), "{vars:?}: {e:?} does not say {w:?}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("64k"), Some(64 << 10));
        assert_eq!(parse_size("256M"), Some(256 << 20));
        assert_eq!(parse_size("2G"), Some(2 << 30));
        assert_eq!(parse_size("x"), None);
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("17179869184G"), None, "2^64 bytes overflows");
        assert_eq!(heap_pages(0), Some(0));
        assert_eq!(heap_pages(1), Some(PAGE));
        assert_eq!(heap_pages(usize::MAX), None);
        assert_eq!(heap_pages(isize::MAX as usize), None);
    }

    #[test]
    fn good_values_are_read() {
        let c = config(&[]);
        assert_eq!(
            (c.backend, c.heap_size, c.peer_timeout, c.wait_timeout),
            (BackendKind::Auto, 256 << 20, DEFAULT_PEER_TIMEOUT, None)
        );
        assert!(!c.force_rma && c.env_error.is_none());
        assert_eq!(c.pes_per_gpu, 1);
        let c = config(&[
            ("SHMEM_BACKEND", " Host "),
            ("SHMEM_HEAP_SIZE", " 64m"),
            ("SHMEM_PEER_TIMEOUT", "2.5"),
            ("SHMEM_WAIT_TIMEOUT", "1e3"),
            ("SHMEM_FORCE_RMA", "on"),
            ("SHMEM_PES_PER_GPU", " 2"),
        ]);
        assert_eq!(c.env_error, None);
        assert_eq!(c.pes_per_gpu, 2);
        assert_eq!((c.backend, c.heap_size), (BackendKind::Host, 64 << 20));
        assert_eq!((c.peer_timeout, c.wait_timeout), (Duration::from_millis(2500), Some(Duration::from_secs(1000))));
        assert!(c.force_rma);
        let c = config(&[("SHMEM_WAIT_TIMEOUT", "0"), ("SHMEM_FORCE_RMA", "0"), ("SHMEM_BACKEND", "")]);
        assert_eq!((c.wait_timeout, c.force_rma, c.backend, c.env_error), (None, false, BackendKind::Auto, None));
    }

    #[test]
    fn bad_values_name_the_variable_and_the_value() {
        error(&[("SHMEM_BACKEND", "cuda")], &["SHMEM_BACKEND=\"cuda\"", "auto, gpu or host"]);
        error(&[("SHMEM_HEAP_SIZE", "1.5G")], &["SHMEM_HEAP_SIZE=\"1.5G\"", "expected bytes"]);
        error(&[("SHMEM_HEAP_SIZE", "-1")], &["SHMEM_HEAP_SIZE=\"-1\""]);
        error(&[("SHMEM_HEAP_SIZE", "")], &["SHMEM_HEAP_SIZE=\"\""]);
        error(&[("SHMEM_HEAP_SIZE", "17179869184G")], &["SHMEM_HEAP_SIZE=\"17179869184G\""]);
        // Rounding up to whole pages used to overflow (a panic in debug builds,
        // a heap of 0 bytes in release builds).
        error(&[("SHMEM_HEAP_SIZE", &usize::MAX.to_string())], &["SHMEM_HEAP_SIZE", "more than one mapping"]);
        for v in ["-1", "nan", "inf", "soon", "", "1e30", "1e300"] {
            // 1e30 and 1e300 used to panic in `Duration::from_secs_f64`.
            error(&[("SHMEM_PEER_TIMEOUT", v)], &[&format!("SHMEM_PEER_TIMEOUT={v:?}"), "seconds"]);
            error(&[("SHMEM_WAIT_TIMEOUT", v)], &[&format!("SHMEM_WAIT_TIMEOUT={v:?}"), "seconds"]);
        }
        error(&[("SHMEM_PEER_TIMEOUT", "0")], &["SHMEM_PEER_TIMEOUT=\"0\"", "more than 0"]);
        error(&[("SHMEM_FORCE_RMA", "2")], &["SHMEM_FORCE_RMA=\"2\"", "1 (on) or 0 (off)"]);
        error(&[("SHMEM_FORCE_RMA", "yes please")], &["SHMEM_FORCE_RMA=\"yes please\""]);
        for v in ["0", "-1", "1.5", "two", ""] {
            error(&[("SHMEM_PES_PER_GPU", v)], &[&format!("SHMEM_PES_PER_GPU={v:?}"), "1 or more"]);
        }
        // Every bad value is reported, not only the first.
        error(
            &[("SHMEM_BACKEND", "x"), ("SHMEM_WAIT_TIMEOUT", "-2")],
            &["SHMEM_BACKEND=\"x\"", "SHMEM_WAIT_TIMEOUT=\"-2\""],
        );
        // A value that is not UTF-8 is an error, not a silent default.
        let bad = OsString::from_vec(vec![b'6', b'4', 0xff]);
        let c = Config::from_lookup(&|name| (name == "SHMEM_HEAP_SIZE").then(|| bad.clone()));
        assert!(c.env_error.is_some_and(|e| e.contains("SHMEM_HEAP_SIZE") && e.contains("UTF-8")));
        // A bad value leaves the default in place (the start-up wait uses it).
        let c = config(&[("SHMEM_PEER_TIMEOUT", "-1"), ("SHMEM_HEAP_SIZE", "lots")]);
        assert_eq!((c.peer_timeout, c.heap_size), (DEFAULT_PEER_TIMEOUT, DEFAULT_HEAP_SIZE));
    }
}
