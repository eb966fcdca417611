//! The kinds of call the PEs agree on: the first word of a descriptor row
//! names one.

use crate::error::Error;

/// Declares the kinds once, in wire order from 1: the values, the names
/// the errors give, and the decoding of a row's word.
macro_rules! op_kinds {
    ($first:ident => $first_name:literal, $($kind:ident => $name:literal,)*) => {
        /// What a descriptor describes.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(u8)]
        pub(crate) enum OpKind {
            $first = 1,
            $($kind,)*
        }

        impl OpKind {
            const ALL: &[OpKind] = &[OpKind::$first, $(OpKind::$kind,)*];

            /// The kind a row's word names, if any.
            pub(crate) fn from_u8(v: u8) -> Option<OpKind> {
                OpKind::ALL.iter().copied().find(|k| *k as u8 == v)
            }

            /// The call's name, as the errors give it.
            pub(crate) fn name(self) -> &'static str {
                match self {
                    OpKind::$first => $first_name,
                    $(OpKind::$kind => $name,)*
                }
            }
        }
    };
}

op_kinds! {
    Barrier => "barrier",
    Broadcast => "broadcast",
    AllGather => "all_gather",
    AllReduce => "all_reduce",
    ReduceScatter => "reduce_scatter",
    AllToAll => "all_to_all",
    Alloc => "alloc",
    Split => "split_strided",
    SplitBases => "split_strided",
    AllToAllV => "all_to_all_v",
    AllToAllV2d => "all_to_all_v_2d",
    AllToAllV2dOffset => "all_to_all_v_2d_offset",
    MoeSetup => "MoeAllToAll::new",
    AllGatherMatmul => "all_gather_matmul",
    MatmulReduceScatter => "matmul_reduce_scatter",
    MoeDispatch => "MoeAllToAll::dispatch",
    MoeCombine => "MoeAllToAll::combine",
}

/// An invalid-arguments error of a `kind` call, named as the call.
pub(crate) fn invalid(kind: OpKind, msg: impl std::fmt::Display) -> Error {
    Error::Invalid(format!("{}: {msg}", kind.name()))
}

/// A length-mismatch error of a `kind` call, named as the call.
pub(crate) fn mismatch(kind: OpKind, msg: impl std::fmt::Display) -> Error {
    Error::LengthMismatch(format!("{}: {msg}", kind.name()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_decodes_from_its_word_and_nothing_else_does() {
        for (i, &k) in OpKind::ALL.iter().enumerate() {
            assert_eq!(k as u8 as usize, i + 1);
            assert_eq!(OpKind::from_u8(k as u8), Some(k));
        }
        assert_eq!(OpKind::from_u8(0), None);
        assert_eq!(OpKind::from_u8(OpKind::ALL.len() as u8 + 1), None);
    }
}
