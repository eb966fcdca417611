//! What bindgen cannot see: the header initialiser macros and `static inline` helpers
//! for initialisation, and the init attribute layout of each NVSHMEM version.
//!
//! The init attribute (`nvshmemx_init_attr_t`, 144 bytes in every version) holds init
//! arguments (`nvshmemx_init_args_t`, 128 bytes) whose layout changed in 3.5:
//!
//! | headers checked            | args layout | `cuda_device_id` | `content` (padding) | version stamps (attr / args) |
//! |----------------------------|-------------|------------------|---------------------|------------------------------|
//! | 3.4.5                      | v1          | —                | offset 32, 96 bytes | `(1<<16)+144` / `(1<<16)+128` |
//! | 3.5.21, 3.6.5, 3.7.2, 3.8.0 | v2         | offset 32, `-1`  | offset 36, 92 bytes | `(2<<16)+144` / `(2<<16)+128` |
//!
//! (offsets inside the args; the args sit at offset 16 of the attribute). The unique id
//! (`nvshmemx_uniqueid_t`, 128 bytes, stamp `(1<<16)+128`) and the unique-id arguments
//! (24 bytes, stamp `(1<<16)+24`) are the same in all five. The numbers come from
//! `layout_check.cpp` compiled with g++ against each version's headers; the const
//! asserts below repeat them.
//!
//! A 3.5+ library reads `cuda_device_id` only when the args carry the v2 stamp, so the
//! stamp, not just the size, must match the layout: use [`InitAttrLayout::for_version`]
//! with the version that `nvshmemx_vendor_get_version_info` reports.

use std::ffi::{c_char, c_int, c_void};
use std::fmt;
use std::mem::{align_of, offset_of, size_of};

use crate::bindings::{nvshmemx_init_attr_t, nvshmemx_uniqueid_args_t, nvshmemx_uniqueid_t};

/// The ABI stamp that NVSHMEM's initialisers put in a struct's `version` field:
/// `(struct version << 16) + sizeof(struct)`.
const fn stamp(struct_version: c_int, size: usize) -> c_int {
    (struct_version << 16) + size as c_int
}

/// `UNIQUEID_ARGS_INVALID` and `INIT_ARGS_SCALAR_INVALID`: "not set" for ranks and
/// the device id.
const INVALID: c_int = -1;

/// `NVSHMEMX_UNIQUEID_INITIALIZER` (`bootstrap_device_host/nvshmem_uniqueid.h`, the same
/// in 3.4 to 3.8): a zeroed id with its version stamp, ready for
/// `nvshmemx_get_uniqueid` to fill in on one PE and for the bytes to travel to the
/// others.
pub const NVSHMEMX_UNIQUEID_INITIALIZER: nvshmemx_uniqueid_t =
    nvshmemx_uniqueid_t { version: stamp(1, size_of::<nvshmemx_uniqueid_t>()), internal: [0; 124] };

/// `NVSHMEMX_UNIQUEID_ARGS_INITIALIZER` (`bootstrap_device_host/nvshmem_uniqueid.h`).
const UNIQUEID_ARGS_INITIALIZER: nvshmemx_uniqueid_args_t = nvshmemx_uniqueid_args_t {
    version: stamp(1, size_of::<nvshmemx_uniqueid_args_t>()),
    id: std::ptr::null_mut(),
    myrank: INVALID,
    nranks: INVALID,
};

/// `nvshmemx_init_args_v1` of the 3.4 headers (`device_host/nvshmem_types.h`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct InitArgs34 {
    /// ABI stamp, `(1 << 16) + 128`.
    pub version: c_int,
    /// Unique-id bootstrap arguments.
    pub uid_args: nvshmemx_uniqueid_args_t,
    /// Reserved, zero.
    pub content: [c_char; 96],
}

/// `nvshmemx_init_attr_v1` of the 3.4 headers (`device_host/nvshmem_types.h`): the
/// attribute that NVSHMEM 3.4.x reads.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct InitAttr34 {
    /// ABI stamp, `(1 << 16) + 144`.
    pub version: c_int,
    /// `MPI_Comm *` for `NVSHMEMX_INIT_WITH_MPI_COMM`; null otherwise.
    pub mpi_comm: *mut c_void,
    /// Bootstrap arguments.
    pub args: InitArgs34,
}

/// `nvshmemx_init_args_v2` of the 3.5 to 3.8 headers (`device_host/nvshmem_types.h`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct InitArgs35 {
    /// ABI stamp, `(2 << 16) + 128`.
    pub version: c_int,
    /// Unique-id bootstrap arguments.
    pub uid_args: nvshmemx_uniqueid_args_t,
    /// The CUDA device for this PE, or -1: use the current context's device.
    pub cuda_device_id: c_int,
    /// Reserved, zero.
    pub content: [c_char; 92],
}

/// `nvshmemx_init_attr_v2` of the 3.5 to 3.8 headers (`device_host/nvshmem_types.h`):
/// the attribute that NVSHMEM 3.5.x to 3.8.x read.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct InitAttr35 {
    /// ABI stamp, `(2 << 16) + 144`.
    pub version: c_int,
    /// `MPI_Comm *` for `NVSHMEMX_INIT_WITH_MPI_COMM`; null otherwise.
    pub mpi_comm: *mut c_void,
    /// Bootstrap arguments.
    pub args: InitArgs35,
}

impl InitAttr34 {
    /// `NVSHMEMX_INIT_ATTR_INITIALIZER` of the 3.4 headers.
    pub const INITIALIZER: Self = Self {
        version: stamp(1, size_of::<Self>()),
        mpi_comm: std::ptr::null_mut(),
        args: InitArgs34 {
            version: stamp(1, size_of::<InitArgs34>()),
            uid_args: UNIQUEID_ARGS_INITIALIZER,
            content: [0; 96],
        },
    };
}

impl InitAttr35 {
    /// `NVSHMEMX_INIT_ATTR_INITIALIZER` of the 3.5 to 3.8 headers.
    pub const INITIALIZER: Self = Self {
        version: stamp(2, size_of::<Self>()),
        mpi_comm: std::ptr::null_mut(),
        args: InitArgs35 {
            version: stamp(2, size_of::<InitArgs35>()),
            uid_args: UNIQUEID_ARGS_INITIALIZER,
            cuda_device_id: INVALID,
            content: [0; 92],
        },
    };
}

// The numbers printed by layout_check.cpp for each version's headers.
const _: () = {
    assert!(size_of::<nvshmemx_uniqueid_t>() == 128 && align_of::<nvshmemx_uniqueid_t>() == 4);
    assert!(offset_of!(nvshmemx_uniqueid_t, internal) == 4);
    assert!(size_of::<nvshmemx_uniqueid_args_t>() == 24);
    assert!(align_of::<nvshmemx_uniqueid_args_t>() == 8);
    assert!(offset_of!(nvshmemx_uniqueid_args_t, id) == 8);
    assert!(offset_of!(nvshmemx_uniqueid_args_t, myrank) == 16);
    assert!(offset_of!(nvshmemx_uniqueid_args_t, nranks) == 20);

    assert!(size_of::<InitArgs34>() == 128 && align_of::<InitArgs34>() == 8);
    assert!(offset_of!(InitArgs34, uid_args) == 8);
    assert!(offset_of!(InitArgs34, content) == 32);
    assert!(size_of::<InitAttr34>() == 144 && align_of::<InitAttr34>() == 8);
    assert!(offset_of!(InitAttr34, mpi_comm) == 8);
    assert!(offset_of!(InitAttr34, args) == 16);

    assert!(size_of::<InitArgs35>() == 128 && align_of::<InitArgs35>() == 8);
    assert!(offset_of!(InitArgs35, uid_args) == 8);
    assert!(offset_of!(InitArgs35, cuda_device_id) == 32);
    assert!(offset_of!(InitArgs35, content) == 36);
    assert!(size_of::<InitAttr35>() == 144 && align_of::<InitAttr35>() == 8);
    assert!(offset_of!(InitAttr35, mpi_comm) == 8);
    assert!(offset_of!(InitAttr35, args) == 16);

    // The generated `nvshmemx_init_attr_t` (3.4.5 headers) is the 3.4 layout; the
    // function pointers take it, and both layouts are passed as a pointer to it.
    assert!(size_of::<nvshmemx_init_attr_t>() == size_of::<InitAttr34>());
    assert!(align_of::<nvshmemx_init_attr_t>() == align_of::<InitAttr34>());
    assert!(offset_of!(nvshmemx_init_attr_t, args) == offset_of!(InitAttr34, args));
};

/// Which init attribute layout a library version reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InitAttrLayout {
    /// NVSHMEM 3.4.x: [`InitAttr34`].
    V34,
    /// NVSHMEM 3.5.x to 3.8.x: [`InitAttr35`], with `cuda_device_id`.
    V35,
}

impl InitAttrLayout {
    /// The layout that NVSHMEM `major.minor` reads, for the versions whose headers
    /// were checked (3.4 to 3.8); any other version is an error, since its layout is
    /// unknown.
    pub fn for_version(major: c_int, minor: c_int) -> Result<Self, UnsupportedVersion> {
        match (major, minor) {
            (3, 4) => Ok(Self::V34),
            (3, 5..=8) => Ok(Self::V35),
            _ => Err(UnsupportedVersion { major, minor }),
        }
    }
}

/// An NVSHMEM version whose init attribute layout this crate does not know.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnsupportedVersion {
    /// Major version of the library.
    pub major: c_int,
    /// Minor version of the library.
    pub minor: c_int,
}

impl fmt::Display for UnsupportedVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "NVSHMEM {}.{} is not supported; supported: 3.4.x, 3.5.x, 3.6.x, 3.7.x, 3.8.x",
            self.major, self.minor
        )
    }
}

impl std::error::Error for UnsupportedVersion {}

/// An init attribute in the layout of one library version, for
/// `nvshmemx_hostlib_init_attr`.
#[derive(Clone, Copy, Debug)]
pub enum InitAttr {
    /// For NVSHMEM 3.4.x.
    V34(InitAttr34),
    /// For NVSHMEM 3.5.x to 3.8.x.
    V35(InitAttr35),
}

impl InitAttr {
    /// `NVSHMEMX_INIT_ATTR_INITIALIZER` of the headers of the given layout.
    pub fn new(layout: InitAttrLayout) -> Self {
        match layout {
            InitAttrLayout::V34 => Self::V34(InitAttr34::INITIALIZER),
            InitAttrLayout::V35 => Self::V35(InitAttr35::INITIALIZER),
        }
    }

    /// The layout of this attribute.
    pub fn layout(&self) -> InitAttrLayout {
        match self {
            Self::V34(_) => InitAttrLayout::V34,
            Self::V35(_) => InitAttrLayout::V35,
        }
    }

    /// What the library's `nvshmemx_set_attr_uniqueid_args` does (`host/init/init.cu`;
    /// it is exported too, but only for its own version's layout): stores the rank,
    /// the number of ranks and the *pointer* to the unique id, which is not copied:
    /// the id must stay in place until `nvshmemx_hostlib_init_attr` returns.
    pub fn set_uniqueid_args(&mut self, myrank: c_int, nranks: c_int, uniqueid: *const nvshmemx_uniqueid_t) {
        let uid_args = match self {
            Self::V34(attr) => &mut attr.args.uid_args,
            Self::V35(attr) => &mut attr.args.uid_args,
        };
        uid_args.id = uniqueid.cast_mut();
        uid_args.myrank = myrank;
        uid_args.nranks = nranks;
    }

    /// The `cuda_device_id` field (3.5+; -1 by default: the device of the context
    /// current at init), or `None` for 3.4, where the device must be made current
    /// before init instead.
    pub fn cuda_device_id_mut(&mut self) -> Option<&mut c_int> {
        match self {
            Self::V34(_) => None,
            Self::V35(attr) => Some(&mut attr.args.cuda_device_id),
        }
    }

    /// The attribute as the pointer type of `nvshmemx_hostlib_init_attr` (the 3.4
    /// struct of the generated bindings; both layouts have its size and alignment).
    pub fn as_mut_ptr(&mut self) -> *mut nvshmemx_init_attr_t {
        match self {
            Self::V34(attr) => std::ptr::from_mut(attr).cast(),
            Self::V35(attr) => std::ptr::from_mut(attr).cast(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `c_int` at byte `offset` of `value`.
    fn int_at<T>(value: &T, offset: usize) -> c_int {
        assert!(offset + size_of::<c_int>() <= size_of::<T>());
        // SAFETY: the read is in bounds (asserted above) and the callers pass the
        // offsets of initialised `c_int` fields; `read_unaligned` needs no alignment.
        unsafe { std::ptr::from_ref(value).cast::<u8>().add(offset).cast::<c_int>().read_unaligned() }
    }

    #[test]
    fn versions_map_to_layouts() {
        assert_eq!(InitAttrLayout::for_version(3, 4), Ok(InitAttrLayout::V34));
        for minor in 5..=8 {
            assert_eq!(InitAttrLayout::for_version(3, minor), Ok(InitAttrLayout::V35));
        }
        for (major, minor) in [(3, 3), (3, 9), (2, 4), (4, 0), (0, 0), (-1, -1)] {
            assert_eq!(InitAttrLayout::for_version(major, minor), Err(UnsupportedVersion { major, minor }));
        }
    }

    #[test]
    fn unsupported_version_says_what_is_supported() {
        let err = InitAttrLayout::for_version(3, 9).unwrap_err();
        assert_eq!(err.to_string(), "NVSHMEM 3.9 is not supported; supported: 3.4.x, 3.5.x, 3.6.x, 3.7.x, 3.8.x");
    }

    // Values printed by layout_check.cpp for the initialisers of each version.
    #[test]
    fn initializers_match_the_headers() {
        assert_eq!(NVSHMEMX_UNIQUEID_INITIALIZER.version, 65664);
        assert!(NVSHMEMX_UNIQUEID_INITIALIZER.internal.iter().all(|&b| b == 0));

        let v34 = InitAttr34::INITIALIZER;
        assert_eq!((v34.version, v34.args.version, v34.args.uid_args.version), (65680, 65664, 65560));
        assert_eq!((v34.args.uid_args.myrank, v34.args.uid_args.nranks), (-1, -1));
        assert!(v34.mpi_comm.is_null() && v34.args.uid_args.id.is_null());
        assert!(v34.args.content.iter().all(|&b| b == 0));

        let v35 = InitAttr35::INITIALIZER;
        assert_eq!((v35.version, v35.args.version, v35.args.uid_args.version), (131216, 131200, 65560));
        assert_eq!((v35.args.uid_args.myrank, v35.args.uid_args.nranks), (-1, -1));
        assert_eq!(v35.args.cuda_device_id, -1);
        assert!(v35.mpi_comm.is_null() && v35.args.uid_args.id.is_null());
        assert!(v35.args.content.iter().all(|&b| b == 0));
    }

    #[test]
    fn device_id_sits_where_the_library_reads_it() {
        let mut attr = InitAttr::new(InitAttrLayout::V35);
        *attr.cuda_device_id_mut().unwrap() = 7;
        let InitAttr::V35(v35) = attr else { unreachable!() };
        // attr.args at 16, args.version at +0, args.cuda_device_id at +32.
        assert_eq!(int_at(&v35, 0), 131216);
        assert_eq!(int_at(&v35, 16), 131200);
        assert_eq!(int_at(&v35, 48), 7);

        assert!(InitAttr::new(InitAttrLayout::V34).cuda_device_id_mut().is_none());
    }

    #[test]
    fn uniqueid_args_are_set_in_both_layouts() {
        let uid = NVSHMEMX_UNIQUEID_INITIALIZER;
        for layout in [InitAttrLayout::V34, InitAttrLayout::V35] {
            let mut attr = InitAttr::new(layout);
            assert_eq!(attr.layout(), layout);
            attr.set_uniqueid_args(3, 8, &uid);
            let uid_args = match attr {
                InitAttr::V34(a) => a.args.uid_args,
                InitAttr::V35(a) => a.args.uid_args,
            };
            assert_eq!((uid_args.myrank, uid_args.nranks), (3, 8));
            assert_eq!(uid_args.id.cast_const(), std::ptr::from_ref(&uid));
            assert_eq!(uid_args.version, 65560);
            let ptr = attr.as_mut_ptr();
            // SAFETY: `ptr` points to the live `attr`, whose first field is the
            // `c_int` version stamp in both layouts.
            let version = unsafe { (*ptr).version };
            let expected = if layout == InitAttrLayout::V34 { 65680 } else { 131216 };
            assert_eq!(version, expected);
        }
    }
}
