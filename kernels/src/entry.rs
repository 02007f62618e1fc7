//! The entry macro: stamps out GPU entry points for concrete (element, operator) pairs.
//!
//! Kernel bodies ([`crate::reduce`], [`crate::pack`], [`crate::flag`]) are generic; a GPU module
//! needs concrete, unmangled symbols. [`reduce_kernels!`](crate::reduce_kernels) writes, for each
//! pair, three `#[unsafe(export_name = ...)]` functions with the kernel ABI of the target
//! (`extern "ptx-kernel"` on NVPTX, `extern "gpu-kernel"` on AMDGPU) named as
//! [`KernelName::reduce`](crate::names::KernelName::reduce) computes. On other targets it only
//! checks the names, so a kernel crate also builds (and can be tested) on the host.

/// Stamps out the reduction entry points for (element, operator) pairs.
///
/// Each pair gets `duralumin_reduce_{T}_{O}`, `duralumin_reduce3_{T}_{O}` and
/// `duralumin_finish_{T}_{O}` (see [`ReduceKernel`](crate::names::ReduceKernel) for their
/// parameters). The name literals must equal [`Element::NAME`](crate::Element::NAME) and
/// [`ReduceOp::NAME`](crate::ReduceOp::NAME); a mismatch or a fragment that is not
/// `[A-Za-z0-9_]{1,48}` is a compile error (export names must be literals, so the macro cannot
/// read the constants itself).
///
/// ```
/// use duralumin_kernels::{Element, ReduceOp, bytemuck, reduce_kernels};
///
/// #[repr(C)]
/// #[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
/// pub struct MinLoc {
///     pub value: f64,
///     pub index: u64,
/// }
/// impl Element for MinLoc {
///     const NAME: &'static str = "minloc";
/// }
///
/// #[derive(Clone, Copy, Debug, Default)]
/// pub struct ArgMin;
/// impl ReduceOp<MinLoc> for ArgMin {
///     const NAME: &'static str = "argmin";
///     fn combine(a: MinLoc, b: MinLoc) -> MinLoc {
///         if b.value < a.value || (b.value == a.value && b.index < a.index) { b } else { a }
///     }
/// }
///
/// reduce_kernels! {
///     MinLoc = "minloc" => [ArgMin = "argmin"];
/// }
/// ```
///
/// A crate that invokes this macro is compiled for the GPU by
/// [`KernelBuilder`](crate::builder::KernelBuilder) (feature `builder`), which enables the
/// unstable ABI features the entry points need; on NVPTX and AMDGPU the crate root also needs
/// nothing else: the panic handler comes from this crate.
///
/// # Safety of the generated entry points
/// They are `unsafe` to call (launch): the arguments must satisfy the `# Safety` section of the
/// body they forward to ([`reduce`](crate::reduce::reduce), [`reduce3`](crate::reduce::reduce3),
/// [`finish`](crate::reduce::finish)) for the whole launch.
#[macro_export]
macro_rules! reduce_kernels {
    ($($elem:ty = $elem_name:literal => [$($op:ty = $op_name:literal),+ $(,)?]);+ $(;)?) => {
        $($(
            $crate::__reduce_entries!($elem, $elem_name, $op, $op_name);
        )+)+
    };
}

/// Entry points and name checks for one pair (implementation of [`reduce_kernels!`]).
#[doc(hidden)]
#[macro_export]
macro_rules! __reduce_entries {
    ($elem:ty, $elem_name:literal, $op:ty, $op_name:literal) => {
        const _: () = {
            use $crate::names::{KernelName, ReduceKernel, fragment_is_valid};
            assert!(
                fragment_is_valid($elem_name) && fragment_is_valid($op_name),
                concat!("kernel name fragments must be 1 to 48 of [A-Za-z0-9_]: ", $elem_name, ", ", $op_name)
            );
            assert!(
                KernelName::reduce::<$elem, $op>(ReduceKernel::Reduce).eq_str(concat!(
                    "duralumin_reduce_",
                    $elem_name,
                    "_",
                    $op_name
                )),
                concat!(
                    "reduce_kernels!: ",
                    stringify!($elem),
                    " = \"",
                    $elem_name,
                    "\" or ",
                    stringify!($op),
                    " = \"",
                    $op_name,
                    "\" does not match Element::NAME / ReduceOp::NAME"
                )
            );
        };
        $crate::__kernel_entry! {
            concat!("duralumin_reduce_", $elem_name, "_", $op_name),
            (dst: *mut $elem, src: *const $elem, n: usize)
            => $crate::reduce::reduce::<$elem, $op, _>($crate::grid::DeviceGrid, dst, src, n)
        }
        $crate::__kernel_entry! {
            concat!("duralumin_reduce3_", $elem_name, "_", $op_name),
            (dst: *mut $elem, a: *const $elem, b: *const $elem, n: usize)
            => $crate::reduce::reduce3::<$elem, $op, _>($crate::grid::DeviceGrid, dst, a, b, n)
        }
        $crate::__kernel_entry! {
            concat!("duralumin_finish_", $elem_name, "_", $op_name),
            (dst: *mut $elem, n: usize, ranks: u32)
            => $crate::reduce::finish::<$elem, $op, _>($crate::grid::DeviceGrid, dst, n, ranks)
        }
    };
}

/// One exported kernel with the target's kernel ABI; nothing on the host.
#[doc(hidden)]
#[macro_export]
#[cfg_attr(target_arch = "nvptx64", allow_internal_unstable(abi_ptx))]
#[cfg_attr(target_arch = "amdgpu", allow_internal_unstable(abi_gpu_kernel))]
macro_rules! __kernel_entry {
    ($name:expr, ($($arg:ident: $ty:ty),* $(,)?) => $body:expr) => {
        #[cfg(target_arch = "nvptx64")]
        const _: () = {
            #[unsafe(export_name = $name)]
            unsafe extern "ptx-kernel" fn entry($($arg: $ty),*) {
                // SAFETY: the launch contract of this entry point is the body's `# Safety`
                // section (see `reduce_kernels!`), which the launching host upholds.
                unsafe { $body }
            }
        };
        #[cfg(target_arch = "amdgpu")]
        const _: () = {
            #[unsafe(export_name = $name)]
            unsafe extern "gpu-kernel" fn entry($($arg: $ty),*) {
                // SAFETY: as above, the launching host upholds the body's contract.
                unsafe { $body }
            }
        };
    };
}

/// Calls `callback! { extra... list }` with every builtin (element, operator) pair, in the syntax
/// of [`reduce_kernels!`]: all twelve numeric elements with `Sum`, `Prod`, `Min`, `Max`,
/// `LogicalAnd`, `LogicalOr`, `LogicalXor` and `Avg`, and the eight integers also with `BitAnd`,
/// `BitOr` and `BitXor` (120 pairs). Tests use it to sweep exactly the set that is built.
///
/// `builtin_reduce_pairs!(callback)` passes the list alone; `builtin_reduce_pairs!(callback, a, b;)`
/// puts the tokens after the first comma (`a, b;`) in front of it. Invoke it in item or statement
/// position (a block expression works: `let n = { builtin_reduce_pairs!(count) };`).
#[macro_export]
macro_rules! builtin_reduce_pairs {
    ($callback:path $(, $($extra:tt)*)?) => {
        $callback! {
            $($($extra)*)?
            i8 = "i8" => [
                $crate::Sum = "sum", $crate::Prod = "prod", $crate::Min = "min", $crate::Max = "max",
                $crate::LogicalAnd = "land", $crate::LogicalOr = "lor", $crate::LogicalXor = "lxor",
                $crate::Avg = "avg", $crate::BitAnd = "band", $crate::BitOr = "bor", $crate::BitXor = "bxor"
            ];
            i16 = "i16" => [
                $crate::Sum = "sum", $crate::Prod = "prod", $crate::Min = "min", $crate::Max = "max",
                $crate::LogicalAnd = "land", $crate::LogicalOr = "lor", $crate::LogicalXor = "lxor",
                $crate::Avg = "avg", $crate::BitAnd = "band", $crate::BitOr = "bor", $crate::BitXor = "bxor"
            ];
            i32 = "i32" => [
                $crate::Sum = "sum", $crate::Prod = "prod", $crate::Min = "min", $crate::Max = "max",
                $crate::LogicalAnd = "land", $crate::LogicalOr = "lor", $crate::LogicalXor = "lxor",
                $crate::Avg = "avg", $crate::BitAnd = "band", $crate::BitOr = "bor", $crate::BitXor = "bxor"
            ];
            i64 = "i64" => [
                $crate::Sum = "sum", $crate::Prod = "prod", $crate::Min = "min", $crate::Max = "max",
                $crate::LogicalAnd = "land", $crate::LogicalOr = "lor", $crate::LogicalXor = "lxor",
                $crate::Avg = "avg", $crate::BitAnd = "band", $crate::BitOr = "bor", $crate::BitXor = "bxor"
            ];
            u8 = "u8" => [
                $crate::Sum = "sum", $crate::Prod = "prod", $crate::Min = "min", $crate::Max = "max",
                $crate::LogicalAnd = "land", $crate::LogicalOr = "lor", $crate::LogicalXor = "lxor",
                $crate::Avg = "avg", $crate::BitAnd = "band", $crate::BitOr = "bor", $crate::BitXor = "bxor"
            ];
            u16 = "u16" => [
                $crate::Sum = "sum", $crate::Prod = "prod", $crate::Min = "min", $crate::Max = "max",
                $crate::LogicalAnd = "land", $crate::LogicalOr = "lor", $crate::LogicalXor = "lxor",
                $crate::Avg = "avg", $crate::BitAnd = "band", $crate::BitOr = "bor", $crate::BitXor = "bxor"
            ];
            u32 = "u32" => [
                $crate::Sum = "sum", $crate::Prod = "prod", $crate::Min = "min", $crate::Max = "max",
                $crate::LogicalAnd = "land", $crate::LogicalOr = "lor", $crate::LogicalXor = "lxor",
                $crate::Avg = "avg", $crate::BitAnd = "band", $crate::BitOr = "bor", $crate::BitXor = "bxor"
            ];
            u64 = "u64" => [
                $crate::Sum = "sum", $crate::Prod = "prod", $crate::Min = "min", $crate::Max = "max",
                $crate::LogicalAnd = "land", $crate::LogicalOr = "lor", $crate::LogicalXor = "lxor",
                $crate::Avg = "avg", $crate::BitAnd = "band", $crate::BitOr = "bor", $crate::BitXor = "bxor"
            ];
            f32 = "f32" => [
                $crate::Sum = "sum", $crate::Prod = "prod", $crate::Min = "min", $crate::Max = "max",
                $crate::LogicalAnd = "land", $crate::LogicalOr = "lor", $crate::LogicalXor = "lxor",
                $crate::Avg = "avg"
            ];
            f64 = "f64" => [
                $crate::Sum = "sum", $crate::Prod = "prod", $crate::Min = "min", $crate::Max = "max",
                $crate::LogicalAnd = "land", $crate::LogicalOr = "lor", $crate::LogicalXor = "lxor",
                $crate::Avg = "avg"
            ];
            $crate::half::f16 = "f16" => [
                $crate::Sum = "sum", $crate::Prod = "prod", $crate::Min = "min", $crate::Max = "max",
                $crate::LogicalAnd = "land", $crate::LogicalOr = "lor", $crate::LogicalXor = "lxor",
                $crate::Avg = "avg"
            ];
            $crate::half::bf16 = "bf16" => [
                $crate::Sum = "sum", $crate::Prod = "prod", $crate::Min = "min", $crate::Max = "max",
                $crate::LogicalAnd = "land", $crate::LogicalOr = "lor", $crate::LogicalXor = "lxor",
                $crate::Avg = "avg"
            ];
        }
    };
}

/// Defines [`BUILTIN_REDUCE_PAIRS`] from a [`builtin_reduce_pairs!`] list. (The callback is
/// invoked in item position: a macro path passed as a fragment cannot be invoked in an
/// expression.)
macro_rules! pair_names {
    ($($elem:ty = $elem_name:literal => [$($op:ty = $op_name:literal),+ $(,)?]);+ $(;)?) => {
        /// Every builtin (element name, operator name) pair, in [`builtin_reduce_pairs!`] order.
        pub const BUILTIN_REDUCE_PAIRS: &[(&str, &str)] = &[$($(($elem_name, $op_name),)+)+];
    };
}

builtin_reduce_pairs!(pair_names);
