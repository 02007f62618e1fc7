//! NCCL's data types and reduction operators, and reductions over the ranks' contributions with
//! the element bodies of `duralumin-kernels`, so results equal the library's own bit for bit.

use std::ffi::c_int;

use duralumin_kernels::bytemuck;
use duralumin_kernels::grid::HostGrid;
use duralumin_kernels::half::{bf16, f16};
use duralumin_kernels::{Avg, Max, Min, Number, Prod, ReduceOp, Sum};

/// `ncclDataType_t`'s size in bytes, `None` for an unknown type.
pub(crate) fn size_of(dtype: c_int) -> Option<usize> {
    Some(match dtype {
        0 | 1 => 1,
        6 | 9 => 2,
        2 | 3 | 7 => 4,
        4 | 5 | 8 => 8,
        _ => return None,
    })
}

/// `ncclDataType_t`'s name in messages.
pub(crate) fn dtype_name(dtype: c_int) -> &'static str {
    match dtype {
        0 => "ncclInt8",
        1 => "ncclUint8",
        2 => "ncclInt32",
        3 => "ncclUint32",
        4 => "ncclInt64",
        5 => "ncclUint64",
        6 => "ncclFloat16",
        7 => "ncclFloat32",
        8 => "ncclFloat64",
        9 => "ncclBfloat16",
        _ => "an unknown type",
    }
}

/// `ncclRedOp_t`'s name in messages.
pub(crate) fn op_name(op: c_int) -> &'static str {
    match op {
        0 => "ncclSum",
        1 => "ncclProd",
        2 => "ncclMax",
        3 => "ncclMin",
        4 => "ncclAvg",
        _ => "an unknown operator",
    }
}

/// Combines the ranks' contributions (byte images of equal length, in rank order) into one.
pub(crate) type Reducer = fn(&[&[u8]]) -> Option<Vec<u8>>;

/// `x0 op x1 op ... op x(n-1)` in rank order, then the operator's finishing step over `n`;
/// `None` if the contributions' lengths differ or are not whole elements.
fn reduce<T: Number, O: ReduceOp<T>>(parts: &[&[u8]]) -> Option<Vec<u8>> {
    let (first, rest) = parts.split_first()?;
    let size = std::mem::size_of::<T>();
    if first.len() % size != 0 || rest.iter().any(|p| p.len() != first.len()) {
        return None;
    }
    let n = first.len() / size;
    let mut acc = vec![<T as bytemuck::Zeroable>::zeroed(); n];
    bytemuck::cast_slice_mut::<T, u8>(&mut acc).copy_from_slice(first);
    let mut next = vec![<T as bytemuck::Zeroable>::zeroed(); n];
    for p in rest {
        bytemuck::cast_slice_mut::<T, u8>(&mut next).copy_from_slice(p);
        HostGrid::SINGLE.reduce::<T, O>(&mut acc, &next);
    }
    if O::HAS_FINISH {
        HostGrid::SINGLE.finish::<T, O>(&mut acc, u32::try_from(parts.len()).ok()?);
    }
    Some(bytemuck::cast_slice::<T, u8>(&acc).to_vec())
}

macro_rules! by_op {
    ($t:ty, $op:expr) => {
        match $op {
            0 => reduce::<$t, Sum> as Reducer,
            1 => reduce::<$t, Prod>,
            2 => reduce::<$t, Max>,
            3 => reduce::<$t, Min>,
            4 => reduce::<$t, Avg>,
            _ => return None,
        }
    };
}

/// The reduction of `dtype` by `op`, `None` if either is unknown.
pub(crate) fn reducer(dtype: c_int, op: c_int) -> Option<Reducer> {
    Some(match dtype {
        0 => by_op!(i8, op),
        1 => by_op!(u8, op),
        2 => by_op!(i32, op),
        3 => by_op!(u32, op),
        4 => by_op!(i64, op),
        5 => by_op!(u64, op),
        6 => by_op!(f16, op),
        7 => by_op!(f32, op),
        8 => by_op!(f64, op),
        9 => by_op!(bf16, op),
        _ => return None,
    })
}
