//! Finding and opening `libnvshmem_host.so.3`.

use std::ffi::OsString;
use std::fmt;
use std::path::{Component, Path, PathBuf};
use std::sync::OnceLock;

use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};

use crate::bindings::Nvshmem;

/// The file names tried in each folder, in order: the soname, then the development
/// link.
pub const LIBRARY_NAMES: [&str; 2] = ["libnvshmem_host.so.3", "libnvshmem_host.so"];

/// The advice that ends a [`LoadError`].
const HOW_TO_POINT: &str = "Point at a library with NVSHMEM_HOME=/path/to/nvshmem (the folder \
     that holds lib/libnvshmem_host.so.3), or put its folder on LD_LIBRARY_PATH.";

/// One place to look: a folder, possibly with `*` in some of its components.
#[derive(Clone, Debug)]
struct Place {
    pattern: PathBuf,
    why: &'static str,
}

/// Where [`load`] looks for the library, in order.
///
/// With `NVSHMEM_HOME` set (and not empty), only `$NVSHMEM_HOME/lib`: an explicit
/// choice is never silently replaced by another library. Otherwise:
///
/// 1. each folder of `LD_LIBRARY_PATH`;
/// 2. Python wheels (`nvidia-nvshmem-cu12`/`-cu13`): `nvidia/nvshmem/lib` under the
///    site-packages of `$VIRTUAL_ENV`, `/opt/*/.venv`, `/usr/local/lib/python3*`
///    (`dist-packages` and `site-packages`), `/usr/lib/python3/dist-packages` and
///    `~/.local/lib/python3*`;
/// 3. `$CONDA_PREFIX/lib` (conda-forge's `libnvshmem`);
/// 4. Debian/Ubuntu packages: `/usr/lib/<arch>-linux-gnu/nvshmem/*`;
/// 5. `/usr/local/nvshmem/lib` and `/opt/nvidia/nvshmem/lib` (tarball installs);
/// 6. the dynamic loader's own search (`dlopen` of the bare soname: `RUNPATH`,
///    `ld.so.cache`, `/lib`, `/usr/lib`).
#[derive(Clone, Debug)]
pub struct SearchPath {
    places: Vec<Place>,
    pinned_by_nvshmem_home: bool,
}

impl SearchPath {
    /// The search path from this process's environment.
    pub fn from_env() -> Self {
        Self::from_lookup(|name| std::env::var_os(name))
    }

    /// The search path from environment values given by `lookup` (`NVSHMEM_HOME`,
    /// `LD_LIBRARY_PATH`, `VIRTUAL_ENV`, `CONDA_PREFIX`, `HOME`), so that a test or a
    /// launcher can describe an environment without changing its own.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<OsString>) -> Self {
        let var = |name: &str| lookup(name).filter(|value| !value.is_empty());
        if let Some(home) = var("NVSHMEM_HOME") {
            return Self {
                places: vec![Place { pattern: Path::new(&home).join("lib"), why: "$NVSHMEM_HOME/lib" }],
                pinned_by_nvshmem_home: true,
            };
        }

        let mut places = Vec::new();
        let mut add = |pattern: PathBuf, why| places.push(Place { pattern, why });
        if let Some(paths) = var("LD_LIBRARY_PATH") {
            for dir in std::env::split_paths(&paths).filter(|d| !d.as_os_str().is_empty()) {
                add(dir, "LD_LIBRARY_PATH");
            }
        }
        let wheel = "nvidia/nvshmem/lib";
        if let Some(venv) = var("VIRTUAL_ENV") {
            let site = Path::new(&venv).join("lib/python3*/site-packages");
            add(site.join(wheel), "Python wheel in $VIRTUAL_ENV");
        }
        let system_sites = [
            "/opt/*/.venv/lib/python3*/site-packages",
            "/usr/local/lib/python3*/dist-packages",
            "/usr/local/lib/python3*/site-packages",
            "/usr/lib/python3/dist-packages",
        ];
        for site in system_sites {
            add(Path::new(site).join(wheel), "Python wheel");
        }
        if let Some(home) = var("HOME") {
            let site = Path::new(&home).join(".local/lib/python3*/site-packages");
            add(site.join(wheel), "Python wheel, pip --user");
        }
        if let Some(conda) = var("CONDA_PREFIX") {
            add(Path::new(&conda).join("lib"), "$CONDA_PREFIX/lib");
        }
        let debian = format!("/usr/lib/{}-linux-gnu/nvshmem/*", std::env::consts::ARCH);
        add(PathBuf::from(debian), "Debian/Ubuntu package");
        add(PathBuf::from("/usr/local/nvshmem/lib"), "tarball install");
        add(PathBuf::from("/opt/nvidia/nvshmem/lib"), "tarball install");
        Self { places, pinned_by_nvshmem_home: false }
    }

    /// Whether `NVSHMEM_HOME` decided the search alone.
    pub fn is_pinned_by_nvshmem_home(&self) -> bool {
        self.pinned_by_nvshmem_home
    }

    /// The folders to look in, in order, with `*` patterns expanded; a pattern that
    /// matches nothing appears as itself, so that it can be reported.
    fn folders(&self) -> Vec<(PathBuf, &'static str, bool)> {
        let mut folders = Vec::new();
        for place in &self.places {
            let matches = expand(&place.pattern);
            if matches.is_empty() {
                folders.push((place.pattern.clone(), place.why, false));
            }
            folders.extend(matches.into_iter().map(|dir| (dir, place.why, true)));
        }
        folders
    }
}

/// What happened at one place that [`load`] tried.
#[derive(Clone, Debug)]
pub struct Attempt {
    /// The folder (or pattern, or bare soname) tried.
    pub place: PathBuf,
    /// Why it was on the search path.
    pub why: &'static str,
    /// What was found there.
    pub outcome: Outcome,
}

/// The result of one [`Attempt`].
#[derive(Clone, Debug)]
pub enum Outcome {
    /// A `*` pattern that matched no folder.
    NoMatch,
    /// A folder without the library (or a folder that does not exist).
    NotFound,
    /// The library is there, or the loader found it, but opening it failed.
    OpenFailed(String),
}

/// The library could not be opened: every place tried, and what was found there.
#[derive(Clone, Debug)]
pub struct LoadError {
    attempts: Vec<Attempt>,
    pinned_by_nvshmem_home: bool,
}

impl LoadError {
    /// Every place tried, in order.
    pub fn attempts(&self) -> &[Attempt] {
        &self.attempts
    }
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "could not load the NVSHMEM host library ({}); looked in:", LIBRARY_NAMES[0])?;
        for attempt in &self.attempts {
            write!(f, "\n  {} ({}): ", attempt.place.display(), attempt.why)?;
            match &attempt.outcome {
                Outcome::NoMatch => write!(f, "no such folder")?,
                Outcome::NotFound => write!(f, "not found")?,
                Outcome::OpenFailed(why) => write!(f, "found, but it failed to load: {why}")?,
            }
        }
        if self.pinned_by_nvshmem_home {
            write!(
                f,
                "\nNVSHMEM_HOME is set, so no other place was searched (unset it to search \
                 LD_LIBRARY_PATH, Python wheels, system packages and the loader's path)."
            )?;
        }
        if self.attempts.iter().any(|a| matches!(&a.outcome, Outcome::OpenFailed(why) if why.contains("libcuda"))) {
            write!(
                f,
                "\nThe CUDA driver library (libcuda.so.1) is missing: NVSHMEM needs a machine \
                 with an NVIDIA driver."
            )?;
        }
        write!(f, "\n{HOW_TO_POINT}")
    }
}

impl std::error::Error for LoadError {}

/// An opened library and where it came from.
pub struct Loaded {
    /// The function table.
    pub library: Nvshmem,
    /// The file opened, or the bare soname when the dynamic loader found it.
    pub path: PathBuf,
}

impl fmt::Debug for Loaded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Loaded").field("path", &self.path).finish_non_exhaustive()
    }
}

/// Opens the library with `RTLD_NOW | RTLD_GLOBAL`: NVSHMEM `dlopen`s its bootstrap
/// and transport plugins, which resolve symbols of the host library globally.
fn open(path: &Path) -> Result<Loaded, String> {
    // SAFETY: opening the library runs its ELF initialisers, which set up NVSHMEM's own
    // globals (C++ static objects, its CUDA and NVML wrappers are loaded only at init)
    // and need nothing from us. Symbols are looked up by name into `Result`s, with the
    // types that bindgen read from NVSHMEM's headers for these exported functions.
    unsafe {
        let library = Library::open(Some(path), RTLD_NOW | RTLD_GLOBAL).map_err(|e| e.to_string())?;
        let library = Nvshmem::from_library(library).map_err(|e| e.to_string())?;
        Ok(Loaded { library, path: path.to_path_buf() })
    }
}

/// Finds and opens the NVSHMEM host library along `search`.
pub fn load_from(search: &SearchPath) -> Result<Loaded, LoadError> {
    let mut attempts = Vec::new();
    for (folder, why, exists) in search.folders() {
        if !exists {
            attempts.push(Attempt { place: folder, why, outcome: Outcome::NoMatch });
            continue;
        }
        let mut outcome = Outcome::NotFound;
        for name in LIBRARY_NAMES {
            let file = folder.join(name);
            if file.is_file() {
                match open(&file) {
                    Ok(loaded) => return Ok(loaded),
                    Err(why) => outcome = Outcome::OpenFailed(format!("{}: {why}", file.display())),
                }
                break;
            }
        }
        attempts.push(Attempt { place: folder, why, outcome });
    }
    if !search.pinned_by_nvshmem_home {
        let soname = Path::new(LIBRARY_NAMES[0]);
        match open(soname) {
            Ok(loaded) => return Ok(loaded),
            Err(why) => attempts.push(Attempt {
                place: soname.to_path_buf(),
                why: "the dynamic loader's search",
                outcome: if why.contains("cannot open shared object file: No such file") {
                    Outcome::NotFound
                } else {
                    Outcome::OpenFailed(why)
                },
            }),
        }
    }
    Err(LoadError { attempts, pinned_by_nvshmem_home: search.pinned_by_nvshmem_home })
}

/// Finds and opens the NVSHMEM host library along [`SearchPath::from_env`].
///
/// Each call opens it again (the loader shares one copy, counting references), and
/// dropping the returned table closes it: keep the table alive as long as NVSHMEM is
/// initialised. [`nvshmem`] opens it once and keeps it open for the process.
pub fn load() -> Result<Nvshmem, LoadError> {
    load_from(&SearchPath::from_env()).map(|loaded| loaded.library)
}

/// The process's library, opened on first use (with [`SearchPath::from_env`]) and
/// kept open until the process ends; the outcome of that first try is kept too.
pub fn loaded() -> Result<&'static Loaded, &'static LoadError> {
    static LOADED: OnceLock<Result<Loaded, LoadError>> = OnceLock::new();
    LOADED.get_or_init(|| load_from(&SearchPath::from_env())).as_ref()
}

/// The function table of [`loaded`].
pub fn nvshmem() -> Result<&'static Nvshmem, &'static LoadError> {
    loaded().map(|loaded| &loaded.library)
}

/// The folders matching `pattern`, whose components may contain `*` (any run of
/// characters, never `/`), in sorted order. A pattern without `*` gives itself if it
/// is a folder, else nothing.
fn expand(pattern: &Path) -> Vec<PathBuf> {
    let mut found = vec![PathBuf::new()];
    for component in pattern.components() {
        let glob = match component {
            Component::Normal(name) => name.to_str().filter(|name| name.contains('*')),
            _ => None,
        };
        found = match glob {
            None => found.into_iter().map(|dir| dir.join(component)).collect(),
            Some(glob) => {
                let mut next = Vec::new();
                for dir in &found {
                    let Ok(entries) = std::fs::read_dir(dir) else {
                        continue;
                    };
                    for entry in entries.flatten() {
                        let name = entry.file_name();
                        if name.to_str().is_some_and(|name| wildcard_match(glob, name)) {
                            next.push(dir.join(name));
                        }
                    }
                }
                next.sort();
                next
            }
        };
    }
    found.retain(|dir| dir.is_dir());
    found
}

/// Whether `name` matches `glob`, where `*` stands for any run of characters.
fn wildcard_match(glob: &str, name: &str) -> bool {
    let mut parts = glob.split('*');
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty(); // no `*`: an exact match
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn search_with(vars: &[(&str, &str)]) -> SearchPath {
        let vars: HashMap<String, OsString> = vars.iter().map(|(k, v)| (k.to_string(), OsString::from(v))).collect();
        SearchPath::from_lookup(move |name| vars.get(name).cloned())
    }

    /// A fresh empty folder under the system temp folder.
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("shmem-sys-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn wildcards() {
        assert!(wildcard_match("python3*", "python3.12"));
        assert!(wildcard_match("python3*", "python3"));
        assert!(!wildcard_match("python3*", "python2.7"));
        assert!(wildcard_match("*", "anything"));
        assert!(wildcard_match("a*b*c", "a-b-c"));
        assert!(wildcard_match("a*b*c", "abc"));
        assert!(!wildcard_match("a*b*c", "a-c-b"));
        assert!(!wildcard_match("ab*ba", "aba"));
        assert!(wildcard_match("exact", "exact"));
        assert!(!wildcard_match("exact", "exactly"));
    }

    #[test]
    #[cfg_attr(miri, ignore = "Miri: no file system under isolation")]
    fn patterns_expand_to_existing_folders() {
        let root = scratch("expand");
        for dir in ["venv/lib/python3.11/x", "venv/lib/python3.12/x", "venv/lib/other/x"] {
            std::fs::create_dir_all(root.join(dir)).unwrap();
        }
        let found = expand(&root.join("venv/lib/python3*/x"));
        assert_eq!(found, [root.join("venv/lib/python3.11/x"), root.join("venv/lib/python3.12/x")]);
        assert!(expand(&root.join("venv/lib/python4*/x")).is_empty());
        assert!(expand(&root.join("missing")).is_empty());
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn nvshmem_home_pins_the_search() {
        let search = search_with(&[("NVSHMEM_HOME", "/opt/nv"), ("LD_LIBRARY_PATH", "/x:/y")]);
        assert!(search.is_pinned_by_nvshmem_home());
        let folders: Vec<PathBuf> = search.places.iter().map(|p| p.pattern.clone()).collect();
        assert_eq!(folders, [PathBuf::from("/opt/nv/lib")]);
    }

    #[test]
    fn default_search_order() {
        let search = search_with(&[
            ("LD_LIBRARY_PATH", "/x::/y"),
            ("HOME", "/home/u"),
            ("VIRTUAL_ENV", "/venv"),
            ("CONDA_PREFIX", "/conda"),
            ("NVSHMEM_HOME", ""),
        ]);
        assert!(!search.is_pinned_by_nvshmem_home());
        let patterns: Vec<String> = search.places.iter().map(|p| p.pattern.display().to_string()).collect();
        let arch = std::env::consts::ARCH;
        assert_eq!(
            patterns,
            [
                "/x".to_string(),
                "/y".to_string(),
                "/venv/lib/python3*/site-packages/nvidia/nvshmem/lib".to_string(),
                "/opt/*/.venv/lib/python3*/site-packages/nvidia/nvshmem/lib".to_string(),
                "/usr/local/lib/python3*/dist-packages/nvidia/nvshmem/lib".to_string(),
                "/usr/local/lib/python3*/site-packages/nvidia/nvshmem/lib".to_string(),
                "/usr/lib/python3/dist-packages/nvidia/nvshmem/lib".to_string(),
                "/home/u/.local/lib/python3*/site-packages/nvidia/nvshmem/lib".to_string(),
                "/conda/lib".to_string(),
                format!("/usr/lib/{arch}-linux-gnu/nvshmem/*"),
                "/usr/local/nvshmem/lib".to_string(),
                "/opt/nvidia/nvshmem/lib".to_string(),
            ]
        );
    }

    #[test]
    #[cfg_attr(miri, ignore = "Miri: no dlopen or file system")]
    fn bogus_nvshmem_home_says_where_it_looked() {
        let err = load_from(&search_with(&[("NVSHMEM_HOME", "/nonexistent/nvshmem")])).unwrap_err();
        let message = err.to_string();
        assert!(
            message.starts_with(
                "could not load the NVSHMEM host library (libnvshmem_host.so.3); looked in:\n  \
                 /nonexistent/nvshmem/lib ($NVSHMEM_HOME/lib): "
            ),
            "{message}"
        );
        assert!(message.contains("NVSHMEM_HOME is set, so no other place was searched"));
        assert!(message.contains("NVSHMEM_HOME=/path/to/nvshmem"));
        assert!(message.contains("LD_LIBRARY_PATH"));
        assert_eq!(err.attempts().len(), 1);
    }

    #[test]
    #[cfg_attr(miri, ignore = "Miri: no dlopen or file system")]
    fn a_file_that_is_not_a_library_is_reported() {
        let root = scratch("not-a-library");
        let lib = root.join("venv/lib/python3.12/site-packages/nvidia/nvshmem/lib");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::write(lib.join("libnvshmem_host.so.3"), b"not an ELF file").unwrap();
        let root_text = root.to_str().unwrap().to_owned();
        let search = search_with(&[
            ("VIRTUAL_ENV", &format!("{root_text}/venv")),
            ("LD_LIBRARY_PATH", &format!("{root_text}/empty")),
        ]);
        let err = match load_from(&search) {
            Err(err) => err,
            // A real NVSHMEM on the loader's path of this machine: nothing to check.
            Ok(loaded) => return assert!(!loaded.path.starts_with(&root)),
        };
        let message = err.to_string();
        assert!(message.contains(&format!("{root_text}/empty (LD_LIBRARY_PATH): no such folder")));
        assert!(message.contains(&format!(
            "{} (Python wheel in $VIRTUAL_ENV): found, but it failed to load: {}",
            lib.display(),
            lib.join("libnvshmem_host.so.3").display()
        )));
        assert!(message.contains("libnvshmem_host.so.3 (the dynamic loader's search)"));
        assert!(!message.contains("NVSHMEM_HOME is set"));
        std::fs::remove_dir_all(root).unwrap();
    }

    /// `load()` itself, in a child process whose environment has a bogus
    /// `NVSHMEM_HOME` (the test harness runs tests on threads of one process, whose
    /// environment a test must not change).
    #[test]
    #[cfg_attr(miri, ignore = "Miri: no processes")]
    fn load_reads_nvshmem_home_from_the_environment() {
        let output = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "load::tests::child_load_with_bogus_home", "--ignored", "--nocapture"])
            .env("NVSHMEM_HOME", "/nonexistent/nvshmem")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{stdout}");
        assert!(stdout.contains("1 passed"), "{stdout}");
    }

    #[test]
    #[ignore = "run by load_reads_nvshmem_home_from_the_environment, in a child process"]
    fn child_load_with_bogus_home() {
        if std::env::var_os("NVSHMEM_HOME").is_none_or(|home| home != "/nonexistent/nvshmem") {
            return; // run directly rather than by its parent test: nothing to check
        }
        let err = load().err().expect("NVSHMEM_HOME=/nonexistent/nvshmem must not load");
        let message = err.to_string();
        assert!(message.contains("looked in:\n  /nonexistent/nvshmem/lib ($NVSHMEM_HOME/lib)"));
        let err = nvshmem().err().expect("the process-wide accessor must fail the same way");
        assert_eq!(err.to_string(), message);
    }

    /// Opens the real library of `NVSHMEM_HOME` (e.g. the wheel of
    /// `ci/gpu-toolchain.sh`). No GPU is needed: the library loads libcuda only in
    /// `nvshmemx_hostlib_init_attr`.
    #[test]
    #[ignore = "needs NVSHMEM_HOME pointing at an NVSHMEM install: eval \"$(ci/gpu-toolchain.sh)\""]
    fn opens_the_library_of_nvshmem_home() {
        let loaded = match load_from(&SearchPath::from_env()) {
            Ok(loaded) => loaded,
            Err(err) => panic!("{err}"),
        };
        let nv = &loaded.library;
        let (mut major, mut minor, mut patch) = (0, 0, 0);
        let version = nv.nvshmemx_vendor_get_version_info.as_ref().unwrap();
        // SAFETY: the function only stores three ints through the pointers, which
        // point to live locals; it needs no initialised NVSHMEM.
        unsafe { version(&mut major, &mut minor, &mut patch) };
        eprintln!("loaded {} : NVSHMEM {major}.{minor}.{patch}", loaded.path.display());
        crate::InitAttrLayout::for_version(major, minor).unwrap();

        let status = nv.nvshmemx_init_status.as_ref().unwrap();
        // SAFETY: reads NVSHMEM's init state; valid before init.
        let status = unsafe { status() };
        assert_eq!(status, crate::NVSHMEM_STATUS_NOT_INITIALIZED as i32);

        // A few of each family resolved (all of them are exported by 3.4.5).
        assert!(nv.nvshmemx_hostlib_init_attr.is_ok());
        assert!(nv.nvshmemx_cumodule_init.is_ok());
        assert!(nv.nvshmemx_bfloat16_sum_reduce_on_stream.is_ok());
        assert!(nv.nvshmemx_putmem_signal_nbi_on_stream.is_ok());
        assert!(nv.nvshmem_team_split_strided.is_ok());
        assert!(nv.nvshmem_uint64_atomic_fetch_add.is_ok());
    }
}
