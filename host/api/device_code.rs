//! Device code: the builtin kernels embedded at build time, and kernel modules of user crates
//! registered at run time, found by entry-point name.
//!
//! The library's build script compiles `duralumin-kernels` (feature `builtin-kernels`) to PTX and
//! AMD code objects and embeds them ([`builtin`]). A program with its own element types or
//! operators builds a kernel crate the same way, with
//! `duralumin_kernels::builder::KernelBuilder` (feature `builder`) in its build script, and registers
//! the result:
//!
//! ```ignore
//! static KERNELS: duralumin::device_code::KernelModule =
//!     include!(concat!(env!("OUT_DIR"), "/kernels.rs"));
//! duralumin::device_code::register(&KERNELS)?;
//! let kernel = duralumin::device_code::find_reduce_ptx::<MinLoc, ArgMin>(ReduceKernel::Reduce)?;
//! ```
//!
//! Device backends look kernels up here ([`find_ptx`], [`find_code_object`]); names come from
//! [`KernelName::reduce`] (the same `const fn` the entry macro checks its symbols against) and
//! [`fixed`]. When the kernels were not built (no nightly toolchain or rust-src) lookups fail
//! with [`Error::KernelsUnavailable`] saying what to install.

use std::collections::HashMap;
use std::sync::{OnceLock, PoisonError, RwLock};

pub use duralumin_kernels::names::fixed;
pub use duralumin_kernels::{CodeObject, KernelModule, KernelName, Ptx, ReduceKernel};

use crate::{Element, Error, ReduceOp, Result};

/// The builtin kernel set, as built by `build.rs`.
static BUILTIN: KernelModule = include!(concat!(env!("OUT_DIR"), "/duralumin_kernels.rs"));

/// How to get the device kernels built.
const INSTALL: &str = "install the nightly toolchain with rust-src (`rustup toolchain install nightly --component \
                       rust-src`), make sure DURALUMIN_SKIP_KERNELS is unset, and rebuild";

/// The builtin kernels: reductions for every builtin (element, operator) pair, pack, unpack,
/// stream-wait and signal. [`KernelModule::unavailable`] says why some or all are missing.
pub fn builtin() -> &'static KernelModule {
    &BUILTIN
}

/// A kernel found in a PTX module.
#[derive(Clone, Copy, Debug)]
pub struct PtxKernel {
    /// The module holding it; load `ptx.text` once per module and context.
    pub module: &'static KernelModule,
    /// The module's PTX.
    pub ptx: &'static Ptx,
    /// The entry point's name.
    pub entry: &'static str,
}

/// A kernel found in an AMD code object.
#[derive(Clone, Copy, Debug)]
pub struct AmdgpuKernel {
    /// The module holding it.
    pub module: &'static KernelModule,
    /// The code object for the requested architecture.
    pub code_object: &'static CodeObject,
    /// The entry point's name.
    pub entry: &'static str,
}

#[derive(Debug)]
struct Registry {
    modules: Vec<&'static KernelModule>,
    /// Entry name -> index in `modules`.
    by_entry: HashMap<&'static str, usize>,
}

impl Registry {
    fn add(&mut self, module: &'static KernelModule) -> Result<()> {
        if self.modules.iter().any(|m| std::ptr::eq(*m, module)) {
            return Ok(());
        }
        if let Some((entry, other)) =
            module.entries.iter().find_map(|e| self.by_entry.get(e).map(|&i| (e, self.modules[i])))
        {
            return Err(Error::KernelsUnavailable(format!(
                "kernel {entry} of {} is already defined by {}; entry names must be unique (check Element::NAME \
                 and ReduceOp::NAME)",
                module.crate_name, other.crate_name
            )));
        }
        let index = self.modules.len();
        self.modules.push(module);
        for entry in module.entries {
            self.by_entry.insert(entry, index);
        }
        Ok(())
    }

    fn find(&self, entry: &str) -> Result<(&'static KernelModule, &'static str)> {
        if let Some(&i) = self.by_entry.get(entry) {
            let module = self.modules[i];
            // The map's keys are the module's own `&'static str`s.
            let name = module.entries.iter().copied().find(|e| *e == entry).unwrap_or_default();
            return Ok((module, name));
        }
        let mut message = format!("no registered kernel module has the kernel {entry}");
        for module in &self.modules {
            if let Some(reason) = module.unavailable {
                message.push_str(&format!("; {} was not (fully) built: {reason}", module.crate_name));
            }
        }
        if BUILTIN.unavailable.is_some() {
            message.push_str(&format!("; to build the builtin kernels, {INSTALL}"));
        }
        message.push_str(
            "; kernels for user (element, operator) pairs are built with duralumin_kernels::builder::KernelBuilder \
             and registered with duralumin::device_code::register",
        );
        Err(Error::KernelsUnavailable(message))
    }
}

fn registry() -> &'static RwLock<Registry> {
    static REGISTRY: OnceLock<RwLock<Registry>> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let mut registry = Registry { modules: Vec::new(), by_entry: HashMap::new() };
        // The builtin module is the first one, with no other to collide with.
        let _ = registry.add(&BUILTIN);
        RwLock::new(registry)
    })
}

/// Registers a user kernel module so its kernels are found by name. Registering the same module
/// twice is a no-op. A module that was not built is registered too, so that failed lookups can
/// say why.
///
/// # Errors
/// [`Error::KernelsUnavailable`] when one of its entry points already belongs to another
/// registered module (the element or operator names collide).
pub fn register(module: &'static KernelModule) -> Result<()> {
    registry().write().unwrap_or_else(PoisonError::into_inner).add(module)
}

/// The name of the `kind` reduction kernel for `T` and `O`, e.g. `duralumin_reduce_f32_sum`.
pub const fn reduce_kernel_name<T: Element, O: ReduceOp<T>>(kind: ReduceKernel) -> KernelName {
    KernelName::reduce::<T, O>(kind)
}

/// Finds the PTX module holding the kernel `entry`.
///
/// # Errors
/// [`Error::KernelsUnavailable`] when no registered module has the kernel or its module has no
/// PTX; the message says why the module was not built and what to install.
pub fn find_ptx(entry: &str) -> Result<PtxKernel> {
    let (module, entry) = registry().read().unwrap_or_else(PoisonError::into_inner).find(entry)?;
    match &module.ptx {
        Some(ptx) => Ok(PtxKernel { module, ptx, entry }),
        None => Err(Error::KernelsUnavailable(format!(
            "{entry} is in {} but its PTX was not built: {}; {INSTALL}",
            module.crate_name,
            module.unavailable.unwrap_or("no PTX architecture was requested")
        ))),
    }
}

/// Finds the code object for AMD GPU architecture `arch` (e.g. `gfx942`, feature suffixes such as
/// `:sramecc+:xnack-` ignored) holding the kernel `entry`.
///
/// # Errors
/// [`Error::KernelsUnavailable`] when no registered module has the kernel, or its module was not
/// built for `arch`.
pub fn find_code_object(entry: &str, arch: &str) -> Result<AmdgpuKernel> {
    let (module, entry) = registry().read().unwrap_or_else(PoisonError::into_inner).find(entry)?;
    match module.code_object(arch) {
        Some(code_object) => Ok(AmdgpuKernel { module, code_object, entry }),
        None => {
            let built: Vec<&str> = module.amdgpu.iter().map(|c| c.target).collect();
            let mut message = format!(
                "{entry} is in {} but not built for {arch} (built for: {})",
                module.crate_name,
                if built.is_empty() { "none".to_owned() } else { built.join(", ") }
            );
            if let Some(reason) = module.unavailable {
                message.push_str(&format!("; {reason}"));
            }
            message.push_str("; add the architecture to the KernelBuilder's amdgpu_archs");
            Err(Error::KernelsUnavailable(message))
        }
    }
}

/// [`find_ptx`] for the `kind` reduction kernel of `T` and `O`.
///
/// # Errors
/// As [`find_ptx`].
pub fn find_reduce_ptx<T: Element, O: ReduceOp<T>>(kind: ReduceKernel) -> Result<PtxKernel> {
    find_ptx(reduce_kernel_name::<T, O>(kind).as_str())
}

/// [`find_code_object`] for the `kind` reduction kernel of `T` and `O`.
///
/// # Errors
/// As [`find_code_object`].
pub fn find_reduce_code_object<T: Element, O: ReduceOp<T>>(kind: ReduceKernel, arch: &str) -> Result<AmdgpuKernel> {
    find_code_object(reduce_kernel_name::<T, O>(kind).as_str(), arch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Avg, Sum};

    #[test]
    fn names_are_computed_like_the_entry_macro_does() {
        assert_eq!(reduce_kernel_name::<f32, Sum>(ReduceKernel::Reduce).as_str(), "duralumin_reduce_f32_sum");
        assert_eq!(reduce_kernel_name::<i64, Avg>(ReduceKernel::Finish).as_str(), "duralumin_finish_i64_avg");
    }

    #[test]
    fn unknown_kernels_are_a_typed_error() {
        let err = find_ptx("duralumin_reduce_nothing_sum").unwrap_err();
        assert!(matches!(err, Error::KernelsUnavailable(ref m) if m.contains("duralumin_reduce_nothing_sum")), "{err}");
    }

    #[test]
    fn registering_twice_is_a_no_op_and_collisions_are_rejected() {
        static EMPTY: KernelModule = KernelModule::unavailable("empty", "test module");
        register(&EMPTY).unwrap();
        register(&EMPTY).unwrap();
        if let Some(first) = builtin().entries.first() {
            // Statics, not a leaked box: the rejected module is referenced by nothing else, and
            // Miri reports leaked memory that no static reaches.
            static ENTRIES: OnceLock<[&'static str; 1]> = OnceLock::new();
            static CLASH: OnceLock<KernelModule> = OnceLock::new();
            let entries = ENTRIES.get_or_init(|| [*first]);
            let clash = CLASH.get_or_init(|| KernelModule {
                crate_name: "clash",
                ptx: None,
                amdgpu: &[],
                entries,
                unavailable: None,
            });
            assert!(matches!(register(clash), Err(Error::KernelsUnavailable(_))));
        }
    }
}
