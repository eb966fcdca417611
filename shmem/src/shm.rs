//! POSIX shared memory: the host backend's heaps, and the control plane's
//! node areas on both backends.

use crate::error::{Error, Result};
use std::ffi::CString;
use std::ptr::NonNull;

/// A `MAP_SHARED` mapping of a POSIX shared-memory object, unmapped on drop.
///
/// The object's name is unlinked as soon as every PE has mapped it (see
/// [`Mapping::unlink`]), so a crash after start-up never leaves it behind
/// in `/dev/shm`; what a creator that dies before then leaves, the launcher
/// removes (see [`is_object_of`]).
pub(crate) struct Mapping {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; every access through it goes
// through raw pointers or atomics whose synchronisation the callers argue.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

/// The name of an object: `/shmem-<pid of the PE that creates it>-<unique, hex>`.
pub(crate) fn object_name(creator: u32, unique: u64) -> String {
    format!("/shmem-{creator}-{unique:x}")
}

/// Whether `file`, an entry of `/dev/shm`, is named as [`object_name`]
/// names the objects that the PE with process id `pe0` creates.
pub(crate) fn is_object_of(file: &str, pe0: u32) -> bool {
    file.strip_prefix("shmem-")
        .and_then(|f| f.strip_prefix(pe0.to_string().as_str()))
        .and_then(|f| f.strip_prefix('-'))
        .is_some_and(|hex| !hex.is_empty() && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

fn c_name(name: &str) -> Result<CString> {
    CString::new(name).map_err(|_| Error::config(format!("shared-memory name {name:?} contains a NUL")))
}

impl Mapping {
    /// Creates the object `name` (which must not exist) of `len` bytes and maps it.
    pub(crate) fn create(name: &str, len: usize) -> Result<Mapping> {
        let cname = c_name(name)?;
        // SAFETY: `cname` is a valid C string; the flags ask for a new object.
        let fd = unsafe { libc::shm_open(cname.as_ptr(), libc::O_CREAT | libc::O_EXCL | libc::O_RDWR, 0o600) };
        if fd < 0 {
            return Err(Error::os("shm_open(create)"));
        }
        // SAFETY: `fd` is the descriptor just opened.
        let sized = unsafe { libc::ftruncate(fd, len as libc::off_t) };
        let result = if sized != 0 { Err(Error::os("ftruncate")) } else { Self::map(fd, len) };
        // SAFETY: `fd` is ours; the mapping (if any) keeps the object alive.
        unsafe { libc::close(fd) };
        if result.is_err() {
            Self::unlink(name);
        }
        result
    }

    /// Opens and maps the existing object `name`, which must be `len` bytes.
    pub(crate) fn open(name: &str, len: usize) -> Result<Mapping> {
        let cname = c_name(name)?;
        // SAFETY: `cname` is a valid C string.
        let fd = unsafe { libc::shm_open(cname.as_ptr(), libc::O_RDWR, 0) };
        if fd < 0 {
            return Err(Error::os("shm_open(open)"));
        }
        // SAFETY: `fd` is valid; `st` is written by fstat before it is read.
        let size = unsafe {
            let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
            if libc::fstat(fd, st.as_mut_ptr()) != 0 {
                libc::close(fd);
                return Err(Error::os("fstat"));
            }
            st.assume_init().st_size as usize
        };
        let result = if size != len {
            Err(Error::bootstrap(format!("shared-memory object {name} is {size} bytes, expected {len}")))
        } else {
            Self::map(fd, len)
        };
        // SAFETY: `fd` is ours.
        unsafe { libc::close(fd) };
        result
    }

    fn map(fd: libc::c_int, len: usize) -> Result<Mapping> {
        // SAFETY: a fresh shared mapping of a descriptor we hold; the kernel
        // picks the address.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0)
        };
        if p == libc::MAP_FAILED {
            return Err(Error::os("mmap"));
        }
        let base = NonNull::new(p.cast::<u8>()).expect("mmap returned null without failing");
        Ok(Mapping { base, len })
    }

    /// Removes the object's name; mappings stay valid until unmapped.
    pub(crate) fn unlink(name: &str) {
        if let Ok(cname) = CString::new(name) {
            // SAFETY: a valid C string; failure (already gone) is harmless.
            unsafe { libc::shm_unlink(cname.as_ptr()) };
        }
    }

    pub(crate) fn base(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` describe a mapping we made and nobody uses
        // after the last owner (the context's `Arc`) is gone.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// Bytes free for shared memory in `/dev/shm`, if it can be told.
pub(crate) fn shm_space_available() -> Option<u64> {
    let path = CString::new("/dev/shm").ok()?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: valid path; `st` is read only when statvfs succeeded.
    let ok = unsafe { libc::statvfs(path.as_ptr(), st.as_mut_ptr()) } == 0;
    ok.then(|| {
        // SAFETY: statvfs succeeded and filled `st`.
        let st = unsafe { st.assume_init() };
        (st.f_bavail as u128 * st.f_frsize as u128).min(u64::MAX as u128) as u64
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_names_are_recognised_by_their_pe0() {
        let name = object_name(12, 0xbeef);
        assert_eq!(name, "/shmem-12-beef");
        let file = &name[1..];
        assert!(is_object_of(file, 12));
        // Another job's PE 0 (a pid that shares a prefix, or another one).
        assert!(!is_object_of(file, 1));
        assert!(!is_object_of(&object_name(123, 0xbeef)[1..], 12));
        // Not a heap's name: no hex after the pid, or something else.
        for other in ["shmem-12-", "shmem-12-notes", "shmem-12", "shmem-asan-test-12", "other-12-beef"] {
            assert!(!is_object_of(other, 12), "{other}");
        }
    }
}
