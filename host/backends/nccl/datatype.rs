//! How elements and operators are presented to NCCL: builtin (element, operator) pairs NCCL has
//! map to its own datatype and operator; everything else moves as bytes and reduces with the
//! Rust kernels.

use std::any::TypeId;
use std::ffi::c_int;

use duralumin_kernels::{Avg, Element, Max, Min, Prod, ReduceOp, Sum};
use half::{bf16, f16};

use crate::ffi::nccl::sys::{dtype, redop};

/// NCCL's datatype of a builtin element, if it has one.
pub(crate) fn nccl_type<T: Element>() -> Option<c_int> {
    let id = TypeId::of::<T>();
    let table: [(TypeId, c_int); 10] = [
        (TypeId::of::<i8>(), dtype::INT8),
        (TypeId::of::<u8>(), dtype::UINT8),
        (TypeId::of::<i32>(), dtype::INT32),
        (TypeId::of::<u32>(), dtype::UINT32),
        (TypeId::of::<i64>(), dtype::INT64),
        (TypeId::of::<u64>(), dtype::UINT64),
        (TypeId::of::<f16>(), dtype::FLOAT16),
        (TypeId::of::<f32>(), dtype::FLOAT32),
        (TypeId::of::<f64>(), dtype::FLOAT64),
        (TypeId::of::<bf16>(), dtype::BFLOAT16),
    ];
    table.iter().find(|(t, _)| *t == id).map(|&(_, d)| d)
}

fn is_float<T: 'static>() -> bool {
    [TypeId::of::<f16>(), TypeId::of::<bf16>(), TypeId::of::<f32>(), TypeId::of::<f64>()].contains(&TypeId::of::<T>())
}

/// A reduction NCCL runs itself: its datatype and operator, and whether the Rust finish
/// kernel must follow (an integer average: NCCL's sum, then the division).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Native {
    pub(crate) dtype: c_int,
    pub(crate) op: c_int,
    pub(crate) finish: bool,
}

/// The native form of `(T, O)`, if NCCL has one.
pub(crate) fn native<T: Element, O: ReduceOp<T>>() -> Option<Native> {
    let dtype = nccl_type::<T>()?;
    let o = TypeId::of::<O>();
    let (op, finish) = match o {
        x if x == TypeId::of::<Sum>() => (redop::SUM, false),
        x if x == TypeId::of::<Prod>() => (redop::PROD, false),
        x if x == TypeId::of::<Max>() => (redop::MAX, false),
        x if x == TypeId::of::<Min>() => (redop::MIN, false),
        x if x == TypeId::of::<Avg>() && is_float::<T>() => (redop::AVG, false),
        x if x == TypeId::of::<Avg>() => (redop::SUM, true),
        _ => return None,
    };
    Some(Native { dtype, op, finish })
}

#[cfg(test)]
mod tests {
    use super::*;
    use duralumin_kernels::BitXor;

    #[test]
    fn builtin_pairs_map_to_nccl_and_the_rest_do_not() {
        assert_eq!(native::<f32, Avg>(), Some(Native { dtype: dtype::FLOAT32, op: redop::AVG, finish: false }));
        assert_eq!(native::<i32, Avg>(), Some(Native { dtype: dtype::INT32, op: redop::SUM, finish: true }));
        assert_eq!(native::<bf16, Max>().map(|n| n.dtype), Some(dtype::BFLOAT16));
        assert_eq!(native::<u32, BitXor>(), None, "bitwise operators reduce with the Rust kernels");
        assert_eq!(native::<i16, Sum>(), None, "NCCL has no 16-bit integers");
    }
}
