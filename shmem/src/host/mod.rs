//! The host backend's data path: PEs are processes of one machine, and
//! every PE's symmetric heap lies in one POSIX shared-memory object that PE
//! 0 creates and every PE maps, so puts and gets are copies and atomics are
//! real atomics on it.
//!
//! Layout of the object (`n` PEs, heap size `h`, both agreed at init):
//!
//! ```text
//! [ header: 4 KiB ][ heap 0: h ]..[ heap n-1: h ]
//! ```
//!
//! The control plane (barriers, agreement, liveness) is not here: see
//! [`crate::control`].

pub(crate) mod a2av;
pub(crate) mod coll;
pub(crate) mod gemm;
pub(crate) mod nodes;
pub(crate) mod rma;
pub(crate) mod team;

use crate::bootstrap::Bootstrap;
use crate::error::{Error, Result};
use crate::heap::asan::HeapMarks;
use crate::shm;
use std::sync::atomic::{AtomicU64, Ordering};

/// The launcher watches its children as the control plane watches peers.
pub(crate) use crate::control::node::proc_state;

const HEADER_BYTES: usize = 4096;
const MAGIC: u64 = 0x7368_6d65_6d5f_6832; // "shmem_h2"

#[repr(C)]
struct Header {
    magic: AtomicU64,
    n_pes: AtomicU64,
    heap_size: AtomicU64,
}

/// Total size of the heaps' object for `n` PEs with `heap_size` bytes each.
pub(crate) fn object_size(n: usize, heap_size: usize) -> Option<usize> {
    heap_size.checked_mul(n)?.checked_add(HEADER_BYTES)
}

/// This PE's view of every PE's heap.
pub(crate) struct HostHeap {
    map: shm::Mapping,
    n: usize,
    heap_size: usize,
    /// ASan builds: the heaps' marks, all poisoned until allocated.
    marks: Option<HeapMarks>,
}

impl HostHeap {
    /// Writes the header of a freshly created object (PE 0, before any
    /// other PE opens it).
    pub(crate) fn init_header(map: &shm::Mapping, n: usize, heap_size: usize) {
        // SAFETY: the header lies at the start of the page-aligned mapping;
        // its fields are atomics. The Release store of `magic`, after the
        // others, pairs with the Acquire load in `new`.
        let h = unsafe { &*map.base().cast::<Header>() };
        h.n_pes.store(n as u64, Ordering::Relaxed);
        h.heap_size.store(heap_size as u64, Ordering::Relaxed);
        h.magic.store(MAGIC, Ordering::Release);
    }

    /// Wraps a mapping of `object_size(n, heap_size)` bytes whose header PE
    /// 0 wrote.
    pub(crate) fn new(map: shm::Mapping, n: usize, heap_size: usize) -> Result<HostHeap> {
        assert_eq!(Some(map.len()), object_size(n, heap_size));
        let mut heap = HostHeap { map, n, heap_size, marks: None };
        heap.marks = HeapMarks::new(heap.heap_ptr(0, 0), heap_size, n);
        if let Some(marks) = heap.marks {
            marks.freed(0, heap_size);
        }
        // SAFETY: the header lies at the start of the mapping, which is
        // page-aligned and at least HEADER_BYTES long; all fields are
        // atomics. Acquire on `magic` pairs with `init_header`'s Release.
        let h = unsafe { &*heap.map.base().cast::<Header>() };
        if h.magic.load(Ordering::Acquire) != MAGIC
            || h.n_pes.load(Ordering::Relaxed) != n as u64
            || h.heap_size.load(Ordering::Relaxed) != heap_size as u64
        {
            return Err(Error::bootstrap("shared heap header does not match this job"));
        }
        Ok(heap)
    }

    /// The heaps of a job of `n` PEs of `heap_size` bytes each: PE 0
    /// creates their object (named after `owner`: PE 0's pid and a number
    /// unique to the context) and every PE maps it.
    ///
    /// # Collective
    /// Every PE of the job calls it.
    pub(crate) fn start(
        boot: &mut Bootstrap,
        me: usize,
        n: usize,
        heap_size: usize,
        (pid, unique): (u32, u64),
    ) -> Result<HostHeap> {
        let total = object_size(n, heap_size)
            .ok_or_else(|| Error::config(format!("{n} heaps of {heap_size} bytes overflow the address space")))?;
        boot.share_object(
            me,
            0,
            total,
            "shared heap",
            || match shm::shm_space_available() {
                Some(free) if (free as u128) < total as u128 => Err(Error::config(format!(
                    "{n} PEs × {heap_size}-byte heaps need {total} bytes of /dev/shm, only {free} are free \
                     (lower SHMEM_HEAP_SIZE)"
                ))),
                _ => {
                    let name = shm::object_name(pid, unique);
                    let map = shm::Mapping::create(&name, total)?;
                    HostHeap::init_header(&map, n, heap_size);
                    Ok((name, map))
                }
            },
            |map| HostHeap::new(map, n, heap_size),
        )
    }

    /// Address of byte `offset` of `pe`'s symmetric heap.
    pub(crate) fn heap_ptr(&self, pe: usize, offset: usize) -> *mut u8 {
        assert!(pe < self.n && offset <= self.heap_size);
        // SAFETY: in bounds of the mapping by the asserts and `object_size`.
        unsafe { self.map.base().add(HEADER_BYTES + pe * self.heap_size + offset) }
    }

    /// ASan builds: the heaps' marks, for the allocator to keep.
    pub(crate) fn marks(&self) -> Option<HeapMarks> {
        self.marks
    }
}

impl Drop for HostHeap {
    fn drop(&mut self) {
        // Before the mapping goes: a later mapping at these addresses (the
        // next context's) must not start out poisoned.
        if let Some(marks) = self.marks {
            marks.allocated(0, self.heap_size);
        }
    }
}
