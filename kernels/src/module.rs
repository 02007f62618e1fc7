//! Description of the device code built from one kernel crate, as embedded in a host program.
//!
//! [`KernelBuilder`](crate::builder::KernelBuilder) writes a Rust expression of type
//! [`KernelModule`] next to the PTX and code objects it built; the host program `include!`s it
//! into a `static` and registers that with the library, which then finds kernels by name.

/// The device code of one kernel crate.
#[derive(Clone, Copy, Debug)]
pub struct KernelModule {
    /// The kernel crate's package name.
    pub crate_name: &'static str,
    /// The NVIDIA module, if it was built.
    pub ptx: Option<Ptx>,
    /// AMD code objects, one per GPU architecture that was built.
    pub amdgpu: &'static [CodeObject],
    /// Every entry point in the module (the same in the PTX and in each code object).
    pub entries: &'static [&'static str],
    /// Why the module, or some of its targets, could not be built (and what to install); `None`
    /// when every requested target was built.
    pub unavailable: Option<&'static str>,
}

/// A PTX module.
#[derive(Clone, Copy, Debug)]
pub struct Ptx {
    /// The virtual architecture the PTX was generated for, e.g. `sm_70`; the driver compiles it
    /// for the GPU it runs on (any newer architecture).
    pub target: &'static str,
    /// The PTX text.
    pub text: &'static str,
}

/// An AMD GPU code object (an ELF shared object for `amdgcn-amd-amdhsa`).
#[derive(Clone, Copy, Debug)]
pub struct CodeObject {
    /// The GPU architecture, e.g. `gfx90a`; a code object runs only on that architecture.
    pub target: &'static str,
    /// The ELF image, loadable with `hipModuleLoadData`.
    pub elf: &'static [u8],
}

impl KernelModule {
    /// A module with no device code, because of `reason`.
    #[inline]
    pub const fn unavailable(crate_name: &'static str, reason: &'static str) -> KernelModule {
        KernelModule { crate_name, ptx: None, amdgpu: &[], entries: &[], unavailable: Some(reason) }
    }

    /// Whether the module has an entry point called `name`.
    #[inline]
    pub fn has_entry(&self, name: &str) -> bool {
        self.entries.contains(&name)
    }

    /// The code object for GPU architecture `target` (e.g. `gfx942`). Feature suffixes of a
    /// device's architecture name (`gfx90a:sramecc+:xnack-`) are ignored.
    #[inline]
    pub fn code_object(&self, target: &str) -> Option<&'static CodeObject> {
        let arch = target.split(':').next().unwrap_or(target);
        self.amdgpu.iter().find(|c| c.target == arch)
    }
}
