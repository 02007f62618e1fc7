//! How elements and reduction operators are presented to MPI.
//!
//! Builtin elements map to MPI's fixed-width types and builtin (element, operator) pairs that
//! MPI supports map to MPI's own operators, so those calls go straight to the MPI library's
//! tuned code. Every other element travels as a contiguous run of bytes
//! (`MPI_Type_contiguous(size_of::<T>(), MPI_UINT8_T)`), and every other operator becomes an MPI
//! user operation whose function is [`user_op_trampoline`] monomorphized for `(T, O)`: no
//! libffi, no allocation per call. Both are created once per type and cached.

use std::any::TypeId;
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::{Mutex, PoisonError};

use duralumin_kernels::{
    Avg, BitAnd, BitOr, BitXor, Element, LogicalAnd, LogicalOr, LogicalXor, Max, Min, Prod, ReduceOp, Sum,
};

use crate::api::error::{Error, Result};
use crate::ffi::{RawDatatype, RawOp, check, sys};

/// The MPI datatype of a builtin element, if MPI has one.
fn builtin_datatype<T: Element>() -> Option<RawDatatype> {
    let id = TypeId::of::<T>();
    // SAFETY: every arm reads an immutable handle constant exported by the rsmpi shim.
    let dt = unsafe {
        match id {
            x if x == TypeId::of::<i8>() => sys::RSMPI_INT8_T,
            x if x == TypeId::of::<i16>() => sys::RSMPI_INT16_T,
            x if x == TypeId::of::<i32>() => sys::RSMPI_INT32_T,
            x if x == TypeId::of::<i64>() => sys::RSMPI_INT64_T,
            x if x == TypeId::of::<u8>() => sys::RSMPI_UINT8_T,
            x if x == TypeId::of::<u16>() => sys::RSMPI_UINT16_T,
            x if x == TypeId::of::<u32>() => sys::RSMPI_UINT32_T,
            x if x == TypeId::of::<u64>() => sys::RSMPI_UINT64_T,
            x if x == TypeId::of::<f32>() => sys::RSMPI_FLOAT,
            x if x == TypeId::of::<f64>() => sys::RSMPI_DOUBLE,
            _ => return None,
        }
    };
    Some(RawDatatype(dt))
}

fn is_integer<T: 'static>() -> bool {
    [
        TypeId::of::<i8>(),
        TypeId::of::<i16>(),
        TypeId::of::<i32>(),
        TypeId::of::<i64>(),
        TypeId::of::<u8>(),
        TypeId::of::<u16>(),
        TypeId::of::<u32>(),
        TypeId::of::<u64>(),
    ]
    .contains(&TypeId::of::<T>())
}

static BYTE_TYPES: Mutex<Option<HashMap<TypeId, RawDatatype>>> = Mutex::new(None);
static USER_OPS: Mutex<Option<HashMap<(TypeId, TypeId), RawOp>>> = Mutex::new(None);

/// The MPI datatype elements of `T` travel as: the builtin one, or a cached contiguous byte
/// type.
pub(crate) fn datatype<T: Element>() -> Result<RawDatatype> {
    if let Some(dt) = builtin_datatype::<T>() {
        return Ok(dt);
    }
    let mut cache = BYTE_TYPES.lock().unwrap_or_else(PoisonError::into_inner);
    let cache = cache.get_or_insert_with(HashMap::new);
    if let Some(dt) = cache.get(&TypeId::of::<T>()) {
        return Ok(*dt);
    }
    let mut dt = std::mem::MaybeUninit::<sys::MPI_Datatype>::uninit();
    let size = c_int::try_from(std::mem::size_of::<T>()).map_err(|_| {
        Error::Unsupported("element types of more than i32::MAX bytes (MPI counts their bytes in an int)")
    })?;
    // SAFETY: MPI writes the new type into `dt` on success (read only then); the base type is
    // a shim constant. Elements are Pod, so their bytes are their whole value.
    let dt = unsafe {
        check(sys::MPI_Type_contiguous(size, sys::RSMPI_UINT8_T, dt.as_mut_ptr()), "MPI_Type_contiguous")?;
        let mut dt = dt.assume_init();
        check(sys::MPI_Type_commit(&mut dt), "MPI_Type_commit")?;
        RawDatatype(dt)
    };
    cache.insert(TypeId::of::<T>(), dt);
    Ok(dt)
}

/// The MPI builtin operator for `(T, O)`, if MPI has one. `Avg` maps to `MPI_SUM`: the
/// division is done by Duralumin afterwards ([`ReduceOp::finish`]).
fn builtin_op<T: Element, O: ReduceOp<T>>() -> Option<RawOp> {
    builtin_datatype::<T>()?;
    let o = TypeId::of::<O>();
    let int = is_integer::<T>();
    // SAFETY: every arm reads an immutable handle constant exported by the rsmpi shim.
    let op = unsafe {
        match o {
            x if x == TypeId::of::<Sum>() || x == TypeId::of::<Avg>() => sys::RSMPI_SUM,
            x if x == TypeId::of::<Prod>() => sys::RSMPI_PROD,
            x if x == TypeId::of::<Min>() => sys::RSMPI_MIN,
            x if x == TypeId::of::<Max>() => sys::RSMPI_MAX,
            // MPI defines the logical and bitwise operators on integer types only.
            x if int && x == TypeId::of::<LogicalAnd>() => sys::RSMPI_LAND,
            x if int && x == TypeId::of::<LogicalOr>() => sys::RSMPI_LOR,
            x if int && x == TypeId::of::<LogicalXor>() => sys::RSMPI_LXOR,
            x if int && x == TypeId::of::<BitAnd>() => sys::RSMPI_BAND,
            x if int && x == TypeId::of::<BitOr>() => sys::RSMPI_BOR,
            x if int && x == TypeId::of::<BitXor>() => sys::RSMPI_BXOR,
            _ => return None,
        }
    };
    Some(RawOp(op))
}

/// The MPI operator for `(T, O)`: MPI's builtin where there is one, else a cached user op.
pub(crate) fn mpi_op<T: Element, O: ReduceOp<T>>() -> Result<RawOp> {
    if let Some(op) = builtin_op::<T, O>() {
        return Ok(op);
    }
    let key = (TypeId::of::<T>(), TypeId::of::<O>());
    let mut cache = USER_OPS.lock().unwrap_or_else(PoisonError::into_inner);
    let cache = cache.get_or_insert_with(HashMap::new);
    if let Some(op) = cache.get(&key) {
        return Ok(*op);
    }
    let mut op = std::mem::MaybeUninit::<sys::MPI_Op>::uninit();
    // SAFETY: the trampoline has exactly the MPI_User_function signature and is valid for the
    // datatype `datatype::<T>()` it will be used with; MPI writes the handle on success.
    let op = unsafe {
        check(
            sys::MPI_Op_create(Some(user_op_trampoline::<T, O>), c_int::from(O::COMMUTATIVE), op.as_mut_ptr()),
            "MPI_Op_create",
        )?;
        RawOp(op.assume_init())
    };
    cache.insert(key, op);
    Ok(op)
}

/// The MPI user function for `(T, O)`: `inout[i] = combine(in[i], inout[i])`.
///
/// MPI passes the contribution of the lower ranks in `invec`, so the argument order keeps
/// non-commutative operators in rank order.
///
/// # Safety
/// Called by MPI only: `invec` and `inoutvec` point to `*len` elements of the datatype this op
/// was registered for, which is always `datatype::<T>()` (contiguous `size_of::<T>()` bytes).
unsafe extern "C" fn user_op_trampoline<T: Element, O: ReduceOp<T>>(
    invec: *mut c_void,
    inoutvec: *mut c_void,
    len: *mut c_int,
    _datatype: *mut sys::MPI_Datatype,
) {
    // SAFETY: MPI passes a valid pointer to the element count.
    let n = usize::try_from(unsafe { *len }).unwrap_or(0);
    let input = invec.cast::<T>().cast_const();
    let inout = inoutvec.cast::<T>();
    // A panic must not unwind into MPI (it would abort the process with no word, or worse):
    // it ends the job with a message.
    let what = || format!("in reduction operator {} on {} inside MPI", O::NAME, T::NAME);
    crate::reliability::abort::or_abort(what, || {
        for i in 0..n {
            // SAFETY: both vectors hold `n` elements (see the function's contract); MPI's
            // temporary buffers need not be aligned for `T`, hence the unaligned accesses. T is
            // Pod, so any bytes are a valid value.
            unsafe {
                let a = input.add(i).read_unaligned();
                let b = inout.add(i).read_unaligned();
                inout.add(i).write_unaligned(O::combine(a, b));
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use half::{bf16, f16};

    #[test]
    #[cfg_attr(miri, ignore = "reads MPI's predefined datatypes, foreign statics Miri cannot read")]
    fn half_types_travel_as_bytes() {
        assert!(builtin_datatype::<f16>().is_none());
        assert!(builtin_datatype::<bf16>().is_none());
        assert!(builtin_datatype::<f32>().is_some());
        assert!(is_integer::<u16>());
        assert!(!is_integer::<f64>());
    }
}
