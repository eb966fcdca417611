//! Start-up configuration: a builder, with defaults from the environment.

use crate::error::{Error, Result};
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
    fn parse(s: &str) -> Result<BackendKind> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" | "" => Ok(BackendKind::Auto),
            "gpu" => Ok(BackendKind::Gpu),
            "host" => Ok(BackendKind::Host),
            other => Err(Error::config(format!("SHMEM_BACKEND={other:?}: expected auto, gpu or host"))),
        }
    }
}

/// Default symmetric heap per PE: 256 MiB (raise it with `SHMEM_HEAP_SIZE`).
pub const DEFAULT_HEAP_SIZE: usize = 256 << 20;
/// Default time a PE waits for its peers to join at start-up.
pub const DEFAULT_PEER_TIMEOUT: Duration = Duration::from_secs(30);

/// How to start shmem. `Config::new()` reads the environment:
///
/// | variable | meaning | default |
/// |---|---|---|
/// | `SHMEM_BACKEND` | `auto`, `gpu` or `host` | `auto` |
/// | `SHMEM_HEAP_SIZE` | symmetric heap per PE, bytes with optional `K`/`M`/`G` | 256M |
/// | `SHMEM_PEER_TIMEOUT` | seconds to wait for peers at start-up | 30 |
/// | `SHMEM_WAIT_TIMEOUT` | seconds any wait may take before failing (`0`: no limit) | no limit |
///
/// A dead peer is noticed within milliseconds whatever the timeouts.
#[derive(Clone, Debug)]
pub struct Config {
    pub(crate) backend: BackendKind,
    pub(crate) heap_size: usize,
    pub(crate) peer_timeout: Duration,
    pub(crate) wait_timeout: Option<Duration>,
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

fn env_secs(name: &str) -> Result<Option<Duration>, String> {
    match std::env::var(name) {
        Err(_) => Ok(None),
        Ok(v) => v
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(|s| Some(Duration::from_secs_f64(s)))
            .ok_or_else(|| format!("{name}={v:?}: expected a number of seconds")),
    }
}

impl Config {
    /// Defaults, overridden by the `SHMEM_*` environment variables.
    pub fn new() -> Config {
        let mut c = Config {
            backend: BackendKind::Auto,
            heap_size: DEFAULT_HEAP_SIZE,
            peer_timeout: DEFAULT_PEER_TIMEOUT,
            wait_timeout: None,
            env_error: None,
        };
        let mut errors = Vec::new();
        if let Ok(v) = std::env::var("SHMEM_BACKEND") {
            match BackendKind::parse(&v) {
                Ok(b) => c.backend = b,
                Err(e) => errors.push(e.to_string()),
            }
        }
        if let Ok(v) = std::env::var("SHMEM_HEAP_SIZE") {
            match parse_size(&v) {
                Some(n) => c.heap_size = n,
                None => errors.push(format!("SHMEM_HEAP_SIZE={v:?}: expected bytes such as 268435456 or 256M")),
            }
        }
        match env_secs("SHMEM_PEER_TIMEOUT") {
            Ok(Some(d)) => c.peer_timeout = d,
            Ok(None) => {}
            Err(e) => errors.push(e),
        }
        match env_secs("SHMEM_WAIT_TIMEOUT") {
            Ok(d) => c.wait_timeout = d.filter(|d| !d.is_zero()),
            Err(e) => errors.push(e),
        }
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
    /// take before it fails with [`Error::Timeout`]; `None` for no limit.
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
    use super::parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("64k"), Some(64 << 10));
        assert_eq!(parse_size("256M"), Some(256 << 20));
        assert_eq!(parse_size("2G"), Some(2 << 30));
        assert_eq!(parse_size("x"), None);
        assert_eq!(parse_size(""), None);
    }
}
