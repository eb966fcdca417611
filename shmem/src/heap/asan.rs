//! AddressSanitizer's view of the symmetric heap, in builds with
//! `-Zsanitizer=address` (where `build.rs` sets cfg `shmem_asan`; in other
//! builds nothing here runs).
//!
//! The heaps lie in one shared mapping, all of which ASan takes for
//! addressable. [`HeapMarks`] poisons, in this process's shadow memory, the
//! bytes of every PE's heap that no live buffer covers — free blocks, and
//! each buffer's padding up to the allocator's alignment — so that a load,
//! store or `memcpy` of this process outside its buffers is reported where
//! it happens. Each PE keeps its own marks; since allocation is collective,
//! every PE marks the same offsets on every heap.

#[cfg(shmem_asan)]
extern "C" {
    // The public interface of ASan's runtime (sanitizer/asan_interface.h).
    fn __asan_poison_memory_region(addr: *const std::ffi::c_void, size: usize);
    fn __asan_unpoison_memory_region(addr: *const std::ffi::c_void, size: usize);
}

/// Where the heaps lie: `n` heaps of `heap_size` bytes from address `heaps`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HeapMarks {
    heaps: usize,
    heap_size: usize,
    n: usize,
}

impl HeapMarks {
    /// Marks for the heaps at `heaps`, in ASan builds with a heap; else `None`.
    pub(crate) fn new(heaps: *mut u8, heap_size: usize, n: usize) -> Option<HeapMarks> {
        (cfg!(shmem_asan) && heap_size > 0).then_some(HeapMarks { heaps: heaps as usize, heap_size, n })
    }

    /// Bytes `offset..offset + len` of every heap may be used.
    pub(crate) fn allocated(&self, offset: usize, len: usize) {
        self.each(offset, len, false);
    }

    /// Bytes `offset..offset + len` of every heap may not be used.
    pub(crate) fn freed(&self, offset: usize, len: usize) {
        self.each(offset, len, true);
    }

    fn each(&self, offset: usize, len: usize, poison: bool) {
        assert!(offset.checked_add(len).is_some_and(|end| end <= self.heap_size));
        for pe in 0..self.n {
            mark(self.heaps + pe * self.heap_size + offset, len, poison);
        }
    }
}

#[cfg(shmem_asan)]
fn mark(addr: usize, len: usize, poison: bool) {
    let addr = addr as *const std::ffi::c_void;
    // SAFETY: the callers pass a range inside the heaps' mapping; the calls
    // change only ASan's shadow of it, never the memory.
    unsafe {
        if poison {
            __asan_poison_memory_region(addr, len);
        } else {
            __asan_unpoison_memory_region(addr, len);
        }
    }
}

#[cfg(not(shmem_asan))]
fn mark(_addr: usize, _len: usize, _poison: bool) {}

#[cfg(all(test, shmem_asan))]
mod tests {
    use crate::heap::{Allocator, ALIGN};
    use crate::shm::Mapping;

    extern "C" {
        fn __asan_address_is_poisoned(addr: *const std::ffi::c_void) -> i32;
    }

    #[test]
    fn only_live_buffers_are_addressable_on_every_heap() {
        let (n, heap) = (2, 4 * ALIGN);
        let name = format!("/shmem-asan-test-{}", std::process::id());
        let map = Mapping::create(&name, n * heap).unwrap();
        Mapping::unlink(&name);
        let marks = super::HeapMarks::new(map.base(), heap, n).expect("an ASan build");
        let poisoned = |pe: usize, offset: usize| {
            // SAFETY: only asks ASan about an address of the mapping.
            unsafe { __asan_address_is_poisoned(map.base().add(pe * heap + offset).cast()) != 0 }
        };
        marks.freed(0, heap);
        let mut a = Allocator::new(heap).with_marks(Some(marks));
        let x = a.alloc(10).unwrap();
        let y = a.alloc(ALIGN).unwrap();
        for pe in 0..n {
            assert!(!poisoned(pe, x) && !poisoned(pe, x + 9), "PE {pe}: the buffer");
            assert!(poisoned(pe, x + 10) && poisoned(pe, x + ALIGN - 1), "PE {pe}: its padding");
            assert!(!poisoned(pe, y + ALIGN - 1) && poisoned(pe, y + ALIGN), "PE {pe}: free space");
        }
        a.free(x, 0);
        assert!((0..n).all(|pe| poisoned(pe, x) && !poisoned(pe, y)), "a freed buffer");
        // As the host backend does before unmapping.
        marks.allocated(0, heap);
        assert!((0..n).all(|pe| !poisoned(pe, x)));
    }
}
