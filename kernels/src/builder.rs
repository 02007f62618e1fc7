//! `KernelBuilder`: compiles a kernel crate to PTX and AMD code objects from a build script.
//!
//! ```no_run
//! // build.rs of a crate whose kernel crate lives in `kernels/`
//! use duralumin_kernels::builder::KernelBuilder;
//!
//! fn main() {
//!     if let Err(e) = KernelBuilder::new("kernels").embed("kernels") {
//!         e.warn();
//!     }
//! }
//! ```
//! and in the crate, `static KERNELS: KernelModule = include!(concat!(env!("OUT_DIR"), "/kernels.rs"));`
//! then `duralumin::device_code::register(&KERNELS)`.
//!
//! # How it builds
//! The kernel crate is compiled by a nested `cargo rustc` of the nightly toolchain with
//! `-Zbuild-std=core` (no prebuilt standard library exists for these targets):
//! * `nvptx64-nvidia-cuda`, `-C target-cpu=sm_70` by default, as an rlib with `--emit=asm`: the
//!   PTX is the assembly output (no linker is needed, so none has to be installed);
//! * `amdgcn-amd-amdhsa`, once per architecture (`gfx90a`, `gfx942`, `gfx1100` by default), as a
//!   `cdylib` linked by rust-lld into an ELF code object.
//!
//! The nested cargo runs with every `CARGO_*`, `RUSTC*` and `RUSTFLAGS` variable the outer build
//! set removed (they describe the outer build: its target, its wrapper, its flags), with
//! `RUSTUP_TOOLCHAIN` set to the toolchain, `panic = "abort"`, one codegen unit, no debug info,
//! no function merging and a lightly optimized `core` (kernels use only its inlined code),
//! in a target directory of its own (shared by the kernel crates of one outer build, so
//! `core` is compiled once per GPU target). It is incremental: an unchanged kernel crate costs a
//! few seconds of cargo checking. The build script reruns when the kernel crate's directory (or a
//! [watched](KernelBuilder::watch) path) changes.
//!
//! Without the nightly toolchain or its `rust-src` component nothing is built and the error says
//! what to install; [`KernelBuilder::embed`] still writes a module description (with the reason),
//! so the host crate builds and its GPU lookups report the reason at run time.
//!
//! Environment: `DURALUMIN_SKIP_KERNELS=1` skips the build; `DURALUMIN_KERNELS_TOOLCHAIN` overrides
//! the toolchain (default `nightly`).

use std::borrow::ToOwned;
use std::collections::BTreeSet;
use std::env;
use std::ffi::OsString;
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::string::{String, ToString};
use std::vec::Vec;
use std::{format, println, vec};

/// Rust target triple of NVIDIA GPUs.
pub const NVPTX_TARGET: &str = "nvptx64-nvidia-cuda";
/// Rust target triple of AMD GPUs.
pub const AMDGPU_TARGET: &str = "amdgcn-amd-amdhsa";
/// Default PTX architecture: sm_70 (Volta) has `nanosleep` and system-scope acquire/release, and
/// the driver JIT-compiles its PTX for every newer GPU.
pub const DEFAULT_PTX_ARCH: &str = "sm_70";
/// Default AMD architectures: MI200, MI300 and RDNA3.
pub const DEFAULT_AMDGPU_ARCHS: [&str; 3] = ["gfx90a", "gfx942", "gfx1100"];

/// Set to a non-empty value other than `0` to skip building device kernels.
pub const SKIP_ENV: &str = "DURALUMIN_SKIP_KERNELS";
/// Overrides the toolchain used for device kernels.
pub const TOOLCHAIN_ENV: &str = "DURALUMIN_KERNELS_TOOLCHAIN";

/// Compiles a kernel crate (a `no_std` crate that invokes
/// [`reduce_kernels!`](crate::reduce_kernels)) for NVIDIA and AMD GPUs.
#[derive(Clone, Debug)]
pub struct KernelBuilder {
    crate_dir: PathBuf,
    features: Vec<String>,
    ptx_arch: Option<String>,
    amdgpu_archs: Vec<String>,
    toolchain: Option<String>,
    target_dir: Option<PathBuf>,
    watch: Vec<PathBuf>,
}

/// What a build produced.
#[derive(Clone, Debug, Default)]
pub struct Artifacts {
    /// The kernel crate's package name.
    pub crate_name: String,
    /// `(architecture, path)` of the PTX module, if it was built.
    pub ptx: Option<(String, PathBuf)>,
    /// `(architecture, path)` of each AMD code object that was built.
    pub code_objects: Vec<(String, PathBuf)>,
    /// Entry points of the module.
    pub entries: Vec<String>,
    /// One line per requested target that failed.
    pub failures: Vec<String>,
}

impl Artifacts {
    /// Prints one `cargo::warning` line naming the targets that failed, if any did.
    pub fn warn_failures(&self) {
        if !self.failures.is_empty() {
            println!(
                "cargo::warning=some device kernels of {} were not built: {}",
                self.crate_name,
                self.failures.join("; ")
            );
        }
    }
}

/// Why nothing was built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BuildErrorKind {
    /// [`SKIP_ENV`] is set.
    Skipped,
    /// The package being built is itself compiled for a GPU (the nested build of a crate whose
    /// build script builds itself): nothing to do.
    GpuTarget,
    /// The toolchain is not installed.
    Toolchain,
    /// The toolchain lacks `rust-src`, which `-Zbuild-std` compiles `core` from.
    RustSrc,
    /// Every target failed to compile (see the log).
    Compile,
    /// Not run from a build script, or the kernel crate could not be read or written.
    Environment,
}

/// A failed kernel build: what happened and what to do about it, on one line.
#[derive(Clone, Debug)]
pub struct BuildError {
    kind: BuildErrorKind,
    message: String,
}

impl BuildError {
    fn new(kind: BuildErrorKind, message: impl Into<String>) -> BuildError {
        BuildError { kind, message: message.into() }
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> &BuildErrorKind {
        &self.kind
    }

    /// The one-line description, including what to install where that is the cause.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Prints the error as a single `cargo::warning` line (nothing for
    /// [`BuildErrorKind::GpuTarget`], which is not a problem).
    pub fn warn(&self) {
        if self.kind != BuildErrorKind::GpuTarget {
            println!("cargo::warning=device kernels not built: {}", self.message);
        }
    }
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for BuildError {}

/// The nightly cargo and rustc to run.
#[derive(Debug)]
struct Toolchain {
    name: String,
    cargo: PathBuf,
    rustc: PathBuf,
}

impl KernelBuilder {
    /// A builder for the kernel crate in `crate_dir` (the directory of its `Cargo.toml`; relative
    /// paths are relative to the calling package's manifest directory), with the default targets.
    pub fn new(crate_dir: impl Into<PathBuf>) -> KernelBuilder {
        KernelBuilder {
            crate_dir: crate_dir.into(),
            features: Vec::new(),
            ptx_arch: Some(DEFAULT_PTX_ARCH.to_owned()),
            amdgpu_archs: DEFAULT_AMDGPU_ARCHS.iter().map(|s| (*s).to_owned()).collect(),
            toolchain: None,
            target_dir: None,
            watch: Vec::new(),
        }
    }

    /// Enables a cargo feature of the kernel crate.
    pub fn feature(mut self, feature: &str) -> KernelBuilder {
        self.features.push(feature.to_owned());
        self
    }

    /// The PTX architecture (`sm_70` by default), or `None` to build no PTX.
    pub fn ptx_arch(mut self, arch: Option<&str>) -> KernelBuilder {
        self.ptx_arch = arch.map(str::to_owned);
        self
    }

    /// The AMD architectures to build code objects for (empty for none).
    pub fn amdgpu_archs(mut self, archs: &[&str]) -> KernelBuilder {
        self.amdgpu_archs = archs.iter().map(|s| (*s).to_owned()).collect();
        self
    }

    /// The rustup toolchain to build with (default `nightly`, or [`TOOLCHAIN_ENV`]).
    pub fn toolchain(mut self, name: &str) -> KernelBuilder {
        self.toolchain = Some(name.to_owned());
        self
    }

    /// The nested build's target directory. By default it is `duralumin-kernels` in the outer
    /// build's profile directory (next to `build/`), so all kernel crates of an outer build share
    /// one compiled `core` per GPU target.
    pub fn target_dir(mut self, dir: impl Into<PathBuf>) -> KernelBuilder {
        self.target_dir = Some(dir.into());
        self
    }

    /// Another path whose change should rebuild the kernels (the kernel crate's directory is
    /// always watched).
    pub fn watch(mut self, path: impl Into<PathBuf>) -> KernelBuilder {
        self.watch.push(path.into());
        self
    }

    /// Builds the module and writes `$OUT_DIR/{file_stem}.rs`, a Rust expression of type
    /// [`KernelModule`](crate::KernelModule) that embeds it (`include_str!`/`include_bytes!`), for
    /// `static K: KernelModule = include!(concat!(env!("OUT_DIR"), "/{file_stem}.rs"));`.
    ///
    /// The file is written even when the build fails, naming the reason in
    /// [`KernelModule::unavailable`](crate::KernelModule::unavailable), so the host crate always
    /// compiles. Partial failures (some targets built) are returned as `Ok` with
    /// [`Artifacts::failures`] set; they are in the module's `unavailable` text as well.
    pub fn embed(&self, file_stem: &str) -> Result<Artifacts, BuildError> {
        let out_dir = out_dir()?;
        let result = self.build();
        let source = match &result {
            Ok(artifacts) => module_source(artifacts),
            Err(e) => {
                format!("::duralumin_kernels::KernelModule::unavailable({:?}, {:?})\n", self.crate_label(), e.message())
            }
        };
        let path = out_dir.join(format!("{file_stem}.rs"));
        fs::write(&path, source).map_err(|e| {
            BuildError::new(BuildErrorKind::Environment, format!("cannot write {}: {e}", path.display()))
        })?;
        result
    }

    /// Builds every requested target. Fails only when nothing could be built; targets that fail
    /// while others succeed are listed in [`Artifacts::failures`].
    pub fn build(&self) -> Result<Artifacts, BuildError> {
        println!("cargo::rerun-if-env-changed={SKIP_ENV}");
        println!("cargo::rerun-if-env-changed={TOOLCHAIN_ENV}");
        let crate_dir = self.crate_dir()?;
        println!("cargo::rerun-if-changed={}", crate_dir.display());
        for path in &self.watch {
            println!("cargo::rerun-if-changed={}", path.display());
        }

        if env::var_os(SKIP_ENV).is_some_and(|v| !v.is_empty() && v != "0") {
            return Err(BuildError::new(
                BuildErrorKind::Skipped,
                format!("{SKIP_ENV} is set; unset it and rebuild to build them"),
            ));
        }
        let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
        if arch == "nvptx64" || arch == "amdgpu" {
            return Err(BuildError::new(BuildErrorKind::GpuTarget, "this package is being built for a GPU"));
        }
        let out_dir = out_dir()?;
        let toolchain = find_toolchain(&self.toolchain_name())?;
        check_rust_src(&toolchain)?;

        let target_dir = self.target_dir.clone().unwrap_or_else(|| default_target_dir(&out_dir));
        let log_path = out_dir.join("duralumin-kernels-build.log");
        let mut log = String::new();
        let artifacts = self.build_targets(&toolchain, &crate_dir, &target_dir, &out_dir, &mut log);
        // The log is a convenience for reading failures; not being able to write it is no failure.
        let _ = fs::write(&log_path, &log);

        if artifacts.ptx.is_none() && artifacts.code_objects.is_empty() {
            let first = artifacts.failures.first().cloned().unwrap_or_else(|| "no target was requested".to_owned());
            return Err(BuildError::new(
                BuildErrorKind::Compile,
                format!("compiling {} failed: {first} (full log: {})", artifacts.crate_name, log_path.display()),
            ));
        }
        Ok(artifacts)
    }

    /// Builds the PTX and every AMD code object asked for; the failures are in the artifacts.
    fn build_targets(
        &self,
        toolchain: &Toolchain,
        crate_dir: &Path,
        target_dir: &Path,
        out_dir: &Path,
        log: &mut String,
    ) -> Artifacts {
        let mut artifacts = Artifacts { crate_name: self.crate_label(), ..Artifacts::default() };
        let mut ptx_entries: Option<BTreeSet<String>> = None;
        if let Some(arch) = &self.ptx_arch {
            match self.build_ptx(toolchain, crate_dir, target_dir, arch, out_dir, log) {
                Ok((path, entries)) => {
                    artifacts.ptx = Some((arch.clone(), path));
                    ptx_entries = Some(entries);
                }
                Err(e) => artifacts.failures.push(format!("{NVPTX_TARGET} ({arch}): {e}")),
            }
        }
        for arch in &self.amdgpu_archs {
            match self.build_code_object(toolchain, crate_dir, target_dir, arch, out_dir, log) {
                Ok((path, entries)) => match &ptx_entries {
                    Some(expected) if *expected != entries => artifacts.failures.push(format!(
                        "{AMDGPU_TARGET} ({arch}): the code object's kernels differ from the PTX's ({} vs {})",
                        entries.len(),
                        expected.len()
                    )),
                    _ => {
                        ptx_entries.get_or_insert(entries);
                        artifacts.code_objects.push((arch.clone(), path));
                    }
                },
                Err(e) => artifacts.failures.push(format!("{AMDGPU_TARGET} ({arch}): {e}")),
            }
        }
        artifacts.entries = ptx_entries.unwrap_or_default().into_iter().collect();
        artifacts
    }

    fn toolchain_name(&self) -> String {
        self.toolchain
            .clone()
            .or_else(|| env::var(TOOLCHAIN_ENV).ok().filter(|s| !s.is_empty()))
            .unwrap_or_else(|| "nightly".to_owned())
    }

    fn crate_dir(&self) -> Result<PathBuf, BuildError> {
        let dir = if self.crate_dir.is_absolute() {
            self.crate_dir.clone()
        } else {
            match env::var_os("CARGO_MANIFEST_DIR") {
                Some(base) => PathBuf::from(base).join(&self.crate_dir),
                None => self.crate_dir.clone(),
            }
        };
        if dir.join("Cargo.toml").is_file() {
            Ok(dir)
        } else {
            Err(BuildError::new(BuildErrorKind::Environment, format!("no Cargo.toml in {}", dir.display())))
        }
    }

    /// The package name from the kernel crate's manifest (for messages and file names).
    fn crate_label(&self) -> String {
        self.crate_dir()
            .ok()
            .and_then(|dir| fs::read_to_string(dir.join("Cargo.toml")).ok())
            .and_then(|manifest| package_name(&manifest))
            .unwrap_or_else(|| self.crate_dir.display().to_string())
    }

    /// Compiles for NVPTX and returns the PTX copied into `out_dir`, with its entry points.
    fn build_ptx(
        &self,
        toolchain: &Toolchain,
        crate_dir: &Path,
        target_dir: &Path,
        arch: &str,
        out_dir: &Path,
        log: &mut String,
    ) -> Result<(PathBuf, BTreeSet<String>), String> {
        let files =
            self.run_cargo(toolchain, crate_dir, target_dir, NVPTX_TARGET, arch, "rlib", &["--emit=asm"], log)?;
        // The assembly output sits in deps/ next to the metadata: deps/lib{name}-{hash}.rmeta ->
        // deps/{name}-{hash}.s.
        let deps = target_dir.join(NVPTX_TARGET).join("release").join("deps");
        let stems: Vec<String> = files
            .iter()
            .filter_map(|f| f.file_stem()?.to_str())
            .map(|stem| stem.strip_prefix("lib").unwrap_or(stem).to_owned())
            .collect();
        let name =
            stems.first().map(|s| s.split('-').next().unwrap_or(s).to_owned()).ok_or("cargo reported no files")?;
        let ptx_path = stems
            .iter()
            .map(|stem| deps.join(format!("{stem}.s")))
            .filter(|p| p.is_file())
            .max_by_key(|p| fs::metadata(p).and_then(|m| m.modified()).ok())
            .ok_or_else(|| format!("no PTX ({name}-*.s) in {}", deps.display()))?;
        let ptx = fs::read_to_string(&ptx_path).map_err(|e| format!("reading {}: {e}", ptx_path.display()))?;
        let external = ptx_external_functions(&ptx);
        if !external.is_empty() {
            return Err(format!(
                "the PTX calls functions it does not define ({}): a kernel can panic or calls a core \
                 function that was not inlined",
                external.join(", ")
            ));
        }
        let entries = ptx_entries(&ptx);
        let dest = out_dir.join(format!("{name}.{arch}.ptx"));
        fs::write(&dest, ptx).map_err(|e| format!("writing {}: {e}", dest.display()))?;
        Ok((dest, entries))
    }

    /// Compiles and links for one AMD architecture; returns the code object copied into
    /// `out_dir`, with its kernels.
    fn build_code_object(
        &self,
        toolchain: &Toolchain,
        crate_dir: &Path,
        target_dir: &Path,
        arch: &str,
        out_dir: &Path,
        log: &mut String,
    ) -> Result<(PathBuf, BTreeSet<String>), String> {
        let files = self.run_cargo(toolchain, crate_dir, target_dir, AMDGPU_TARGET, arch, "cdylib", &[], log)?;
        let elf = files
            .iter()
            .find(|f| f.extension().is_some_and(|e| e == "elf" || e == "so"))
            .ok_or("cargo reported no code object")?;
        let bytes = fs::read(elf).map_err(|e| format!("reading {}: {e}", elf.display()))?;
        let entries = elf_kernels(&bytes)?;
        let name = elf.file_stem().and_then(|s| s.to_str()).unwrap_or("kernels");
        let dest = out_dir.join(format!("{name}.{arch}.hsaco"));
        fs::write(&dest, bytes).map_err(|e| format!("writing {}: {e}", dest.display()))?;
        Ok((dest, entries))
    }

    /// Runs the nested cargo for one target and returns the files of the kernel crate's artifact.
    #[allow(clippy::too_many_arguments)]
    fn run_cargo(
        &self,
        toolchain: &Toolchain,
        crate_dir: &Path,
        target_dir: &Path,
        triple: &str,
        cpu: &str,
        crate_type: &str,
        rustc_args: &[&str],
        log: &mut String,
    ) -> Result<Vec<PathBuf>, String> {
        let mut cmd = Command::new(&toolchain.cargo);
        cmd.current_dir(crate_dir);
        for (key, _) in env::vars_os() {
            if inherited_build_variable(&key) {
                cmd.env_remove(&key);
            }
        }
        cmd.env("RUSTUP_TOOLCHAIN", &toolchain.name)
            .env("RUSTC", &toolchain.rustc)
            // Identical kernels (e.g. `band` on i32 and u32) must stay separate symbols: merged
            // functions become aliases, which have no AMD kernel descriptor.
            .env("RUSTFLAGS", format!("-C target-cpu={cpu} -Z merge-functions=disabled"));
        cmd.arg("rustc")
            .arg("--manifest-path")
            .arg(crate_dir.join("Cargo.toml"))
            .args(["--lib", "--release", "--target", triple, "-Zbuild-std=core", "--crate-type", crate_type])
            .arg("--target-dir")
            .arg(target_dir)
            .args(["--message-format=json-render-diagnostics", "--color", "never"]);
        for setting in NESTED_PROFILE {
            cmd.args(["--config", setting]);
        }
        if !self.features.is_empty() {
            cmd.arg("--features").arg(self.features.join(","));
        }
        cmd.arg("--").args(rustc_args);
        cmd.stdin(Stdio::null());

        log.push_str(&format!("$ {cmd:?}\n"));
        let output = cmd.output().map_err(|e| format!("cannot run {}: {e}", toolchain.cargo.display()))?;
        let stderr = String::from_utf8_lossy(&output.stderr);
        log.push_str(&stderr);
        log.push('\n');
        if !output.status.success() {
            return Err(first_error(&stderr));
        }
        let stdout = String::from_utf8_lossy(&output.stdout);
        let artifact = stdout
            .lines()
            .rfind(|l| l.contains("\"reason\":\"compiler-artifact\""))
            .ok_or("cargo reported no artifact")?;
        Ok(json_string_array(artifact, "filenames").into_iter().map(PathBuf::from).collect())
    }
}

/// The nested build's release profile, whatever the outer build's is.
const NESTED_PROFILE: [&str; 12] = [
    "profile.release.panic=\"abort\"",
    "profile.release.codegen-units=1",
    "profile.release.debug=false",
    "profile.release.strip=\"none\"",
    "profile.release.lto=false",
    "profile.release.opt-level=3",
    "profile.release.incremental=false",
    "profile.release.overflow-checks=false",
    "profile.release.debug-assertions=false",
    // `core` contributes only inlined code to kernels, which is optimized in the kernel
    // crate; compiling its own code at opt-level 1 saves about half of the first build
    // (AMDGPU codegen of an optimized core takes over a minute per target). Level 1, not
    // 0, avoids an AMDGPU backend failure on unoptimized calls (gfx1100). Other
    // dependencies keep the release level: their small functions are inlined across
    // crates only when they are optimized (half's f16 operators are not `#[inline]`).
    "profile.release.package.core.opt-level=1",
    "profile.release.package.core.codegen-units=16",
    "profile.release.package.compiler_builtins.opt-level=1",
];

/// Whether an environment variable describes the outer build and must not reach the nested cargo.
/// Registry, network and home settings are kept: they describe the machine, not the build.
fn inherited_build_variable(key: &OsString) -> bool {
    let Some(key) = key.to_str() else { return false };
    let kept = ["CARGO_HOME", "CARGO_NET_", "CARGO_HTTP_", "CARGO_REGISTRIES_", "CARGO_REGISTRY_", "CARGO_MAKEFLAGS"];
    if kept.iter().any(|k| key == *k || (k.ends_with('_') && key.starts_with(k))) {
        return false;
    }
    key == "CARGO"
        || key.starts_with("CARGO_")
        || key.starts_with("__CARGO")
        || key.starts_with("RUSTC")
        || key.starts_with("RUSTDOC")
        || key == "RUSTFLAGS"
        || key == "RUSTUP_TOOLCHAIN"
}

fn out_dir() -> Result<PathBuf, BuildError> {
    env::var_os("OUT_DIR").map(PathBuf::from).ok_or_else(|| {
        BuildError::new(BuildErrorKind::Environment, "OUT_DIR is not set: call KernelBuilder from a build script")
    })
}

/// `<target>/<profile>/duralumin-kernels` when `out_dir` is `<target>/<profile>/build/<pkg>/out`.
fn default_target_dir(out_dir: &Path) -> PathBuf {
    let build = out_dir.parent().and_then(Path::parent);
    match build {
        Some(build) if build.file_name().is_some_and(|n| n == "build") => match build.parent() {
            Some(profile) => profile.join("duralumin-kernels"),
            None => out_dir.join("duralumin-kernels"),
        },
        _ => out_dir.join("duralumin-kernels"),
    }
}

fn find_toolchain(name: &str) -> Result<Toolchain, BuildError> {
    let install = format!("rustup toolchain install {name} --component rust-src");
    let missing = |detail: String| {
        BuildError::new(
            BuildErrorKind::Toolchain,
            format!("the {name} Rust toolchain is needed ({detail}); install it with `{install}`"),
        )
    };
    let rustup = find_rustup().ok_or_else(|| missing("rustup was not found".to_owned()))?;
    let which = |tool: &str| -> Result<PathBuf, BuildError> {
        let out = Command::new(&rustup)
            .args(["which", "--toolchain", name, tool])
            .env_remove("RUSTUP_TOOLCHAIN")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| missing(format!("running rustup: {e}")))?;
        if !out.status.success() {
            return Err(missing(format!("`rustup which --toolchain {name} {tool}` failed")));
        }
        Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
    };
    Ok(Toolchain { name: name.to_owned(), cargo: which("cargo")?, rustc: which("rustc")? })
}

fn find_rustup() -> Option<PathBuf> {
    let exe = if cfg!(windows) { "rustup.exe" } else { "rustup" };
    let mut dirs: Vec<PathBuf> = env::var_os("PATH").map(|p| env::split_paths(&p).collect()).unwrap_or_default();
    if let Some(home) = env::var_os("CARGO_HOME") {
        dirs.push(PathBuf::from(home).join("bin"));
    }
    if let Some(home) = env::var_os("HOME") {
        dirs.push(PathBuf::from(home).join(".cargo").join("bin"));
    }
    dirs.into_iter().map(|d| d.join(exe)).find(|p| p.is_file())
}

fn check_rust_src(toolchain: &Toolchain) -> Result<(), BuildError> {
    let fix = format!("rustup component add rust-src --toolchain {}", toolchain.name);
    let out = Command::new(&toolchain.rustc)
        .args(["--print", "sysroot"])
        .env_remove("RUSTUP_TOOLCHAIN")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            BuildError::new(BuildErrorKind::Toolchain, format!("cannot run {}: {e}", toolchain.rustc.display()))
        })?;
    let sysroot = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let core = sysroot.join("lib/rustlib/src/rust/library/core/Cargo.toml");
    if out.status.success() && core.is_file() {
        Ok(())
    } else {
        Err(BuildError::new(
            BuildErrorKind::RustSrc,
            format!(
                "the {} toolchain has no rust-src component (needed by -Zbuild-std); install it with `{fix}`",
                toolchain.name
            ),
        ))
    }
}

/// The `[package] name` of a manifest.
fn package_name(manifest: &str) -> Option<String> {
    let mut in_package = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_package = line == "[package]";
        } else if let Some(value) =
            line.strip_prefix("name").filter(|_| in_package).and_then(|r| r.trim_start().strip_prefix('='))
        {
            return Some(value.trim().trim_matches('"').to_owned());
        }
    }
    None
}

/// The first `error` line of cargo's stderr, or its last line.
fn first_error(stderr: &str) -> String {
    stderr
        .lines()
        .find(|l| l.starts_with("error"))
        .or_else(|| stderr.lines().rev().find(|l| !l.trim().is_empty()))
        .unwrap_or("cargo failed without a message")
        .trim()
        .to_owned()
}

/// The strings of `"key":[...]` in one line of cargo's JSON output.
fn json_string_array(line: &str, key: &str) -> Vec<String> {
    let needle = format!("\"{key}\":[");
    let Some(start) = line.find(&needle) else { return Vec::new() };
    let mut chars = line[start + needle.len()..].chars();
    let mut out = Vec::new();
    loop {
        match chars.next() {
            Some('"') => {
                let mut s = String::new();
                loop {
                    match chars.next() {
                        Some('\\') => match chars.next() {
                            Some('n') => s.push('\n'),
                            Some('t') => s.push('\t'),
                            Some('u') => {
                                let hex: String = chars.by_ref().take(4).collect();
                                if let Some(c) = u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32) {
                                    s.push(c);
                                }
                            }
                            Some(c) => s.push(c),
                            None => break,
                        },
                        Some('"') | None => break,
                        Some(c) => s.push(c),
                    }
                }
                out.push(s);
            }
            Some(']') | None => return out,
            Some(_) => {}
        }
    }
}

/// Entry points of a PTX module (`.entry NAME(`).
pub fn ptx_entries(ptx: &str) -> BTreeSet<String> {
    ptx.lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let rest = l.strip_prefix(".visible .entry ").or_else(|| l.strip_prefix(".entry "))?;
            Some(rest.split(['(', ' ']).next()?.trim().to_owned())
        })
        .collect()
}

/// Functions a PTX module declares but does not define (`.extern .func`): calls the driver cannot
/// resolve.
pub fn ptx_external_functions(ptx: &str) -> Vec<String> {
    ptx.lines()
        .filter_map(|l| {
            let mut rest = l.trim_start().strip_prefix(".extern .func")?.trim();
            // `.extern .func (.param .b32 ret) name(...)`: skip the return value.
            if rest.starts_with('(') {
                rest = rest.split_once(')').map_or("", |(_, r)| r).trim();
            }
            let name = rest.split(['(', ' ', ';']).next().unwrap_or_default();
            Some(if name.is_empty() { l.trim().to_owned() } else { name.to_owned() })
        })
        .collect()
}

/// Kernels of an AMD code object: the symbols with a kernel descriptor (`NAME.kd`).
pub fn elf_kernels(elf: &[u8]) -> Result<BTreeSet<String>, String> {
    let read = |at: usize, len: usize| -> Result<u64, String> {
        let bytes = at.checked_add(len).and_then(|end| elf.get(at..end)).ok_or("truncated ELF file")?;
        let mut v = 0u64;
        for (i, b) in bytes.iter().enumerate() {
            v |= u64::from(*b) << (8 * i);
        }
        Ok(v)
    };
    if elf.get(0..4) != Some(b"\x7fELF".as_slice()) || elf.get(4) != Some(&2) || elf.get(5) != Some(&1) {
        return Err("not a 64-bit little-endian ELF file".to_owned());
    }
    const EM_AMDGPU: u64 = 224;
    if read(18, 2)? != EM_AMDGPU {
        return Err("not an AMD GPU code object (e_machine is not EM_AMDGPU)".to_owned());
    }
    // An offset or size that does not fit `usize` lies past the end of the file.
    let read_usize = |at: usize, len: usize| -> Result<usize, String> {
        usize::try_from(read(at, len)?).map_err(|_| "truncated ELF file".to_owned())
    };
    let (shoff, shentsize, shnum) = (read_usize(0x28, 8)?, read_usize(0x3a, 2)?, read_usize(0x3c, 2)?);
    let section = |i: usize| -> Result<(u64, usize, usize, usize, usize), String> {
        let at = i.checked_mul(shentsize).and_then(|o| o.checked_add(shoff)).ok_or("bad section table")?;
        // (type, link, offset, size, entsize)
        Ok((
            read(at + 4, 4)?,
            read_usize(at + 40, 4)?,
            read_usize(at + 24, 8)?,
            read_usize(at + 32, 8)?,
            read_usize(at + 56, 8)?,
        ))
    };
    let mut kernels = BTreeSet::new();
    for i in 0..shnum {
        let (kind, link, offset, size, entsize) = section(i)?;
        const SHT_SYMTAB: u64 = 2;
        const SHT_DYNSYM: u64 = 11;
        if (kind != SHT_SYMTAB && kind != SHT_DYNSYM) || entsize == 0 {
            continue;
        }
        let (_, _, str_offset, str_size, _) = section(link)?;
        let strings = str_offset
            .checked_add(str_size)
            .and_then(|end| elf.get(str_offset..end))
            .ok_or("truncated string table")?;
        for s in 0..size / entsize {
            let at = s.checked_mul(entsize).and_then(|o| o.checked_add(offset)).ok_or("bad symbol table")?;
            let name_at = read_usize(at, 4)?;
            let name = strings.get(name_at..).unwrap_or_default();
            let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
            if let Some(kernel) = std::str::from_utf8(name).ok().and_then(|n| n.strip_suffix(".kd")) {
                kernels.insert(kernel.to_owned());
            }
        }
    }
    Ok(kernels)
}

/// The Rust expression describing built artifacts (see [`KernelBuilder::embed`]).
fn module_source(a: &Artifacts) -> String {
    let path = |p: &Path| format!("{:?}", p.display().to_string());
    let ptx = match &a.ptx {
        Some((arch, p)) => format!(
            "::core::option::Option::Some(::duralumin_kernels::Ptx {{ target: {arch:?}, text: include_str!({}) }})",
            path(p)
        ),
        None => "::core::option::Option::None".to_owned(),
    };
    let code_objects: Vec<String> = a
        .code_objects
        .iter()
        .map(|(arch, p)| {
            // ELF readers and loaders expect an 8-byte aligned image; `include_bytes!` gives 1.
            format!(
                "        ::duralumin_kernels::CodeObject {{ target: {arch:?}, elf: {{\n\
                 \x20           #[repr(C, align(16))]\n\
                 \x20           struct Aligned<T: ?::core::marker::Sized>(T);\n\
                 \x20           static IMAGE: &Aligned<[u8]> = &Aligned(*include_bytes!({}));\n\
                 \x20           &IMAGE.0\n\
                 \x20       }} }},\n",
                path(p)
            )
        })
        .collect();
    let entries: Vec<String> = a.entries.iter().map(|e| format!("        {e:?},\n")).collect();
    let unavailable = if a.failures.is_empty() {
        "::core::option::Option::None".to_owned()
    } else {
        format!("::core::option::Option::Some({:?})", a.failures.join("; "))
    };
    let mut s = vec![
        format!("// Generated by duralumin_kernels::builder::KernelBuilder for `{}`.\n", a.crate_name),
        "::duralumin_kernels::KernelModule {\n".to_owned(),
        format!("    crate_name: {:?},\n", a.crate_name),
        format!("    ptx: {ptx},\n"),
        "    amdgpu: &[\n".to_owned(),
    ];
    s.extend(code_objects);
    s.push("    ],\n    entries: &[\n".to_owned());
    s.extend(entries);
    s.push(format!("    ],\n    unavailable: {unavailable},\n}}\n"));
    s.concat()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_arrays_are_read() {
        let line = r#"{"reason":"compiler-artifact","filenames":["/a/lib\"x.rlib","/b/c.s"],"executable":null}"#;
        assert_eq!(json_string_array(line, "filenames"), vec!["/a/lib\"x.rlib".to_owned(), "/b/c.s".to_owned()]);
        assert!(json_string_array(line, "nope").is_empty());
    }

    #[test]
    fn ptx_entries_and_externals_are_found() {
        let ptx = ".visible .entry duralumin_signal(\n.param .u64 x\n)\n.extern .func (.param .b32 r) vprintf\n(\n";
        assert_eq!(ptx_entries(ptx).into_iter().collect::<Vec<_>>(), vec!["duralumin_signal".to_owned()]);
        assert_eq!(ptx_external_functions(ptx), vec!["vprintf".to_owned()]);
    }

    #[test]
    fn package_names_are_read() {
        assert_eq!(package_name("[package]\nname = \"a-b\"\n[lib]\nname = \"c\"\n").as_deref(), Some("a-b"));
        assert_eq!(package_name("[lib]\nname = \"c\"\n"), None);
    }

    #[test]
    fn build_variables_are_filtered() {
        for key in ["CARGO", "CARGO_TARGET_DIR", "CARGO_ENCODED_RUSTFLAGS", "RUSTC_WORKSPACE_WRAPPER", "RUSTFLAGS"] {
            assert!(inherited_build_variable(&OsString::from(key)), "{key}");
        }
        for key in ["CARGO_HOME", "CARGO_NET_OFFLINE", "PATH", "HOME", "CARGO_MAKEFLAGS"] {
            assert!(!inherited_build_variable(&OsString::from(key)), "{key}");
        }
    }

    #[test]
    fn target_dir_is_shared_at_the_profile_level() {
        assert_eq!(
            default_target_dir(Path::new("/t/release/build/duralumin-0123/out")),
            PathBuf::from("/t/release/duralumin-kernels")
        );
        assert_eq!(default_target_dir(Path::new("/x/out")), PathBuf::from("/x/out/duralumin-kernels"));
    }

    #[test]
    fn a_missing_toolchain_is_a_typed_error_naming_the_fix() {
        let Err(err) = find_toolchain("duralumin-no-such-toolchain") else {
            panic!("found a toolchain that does not exist")
        };
        assert_eq!(err.kind(), &BuildErrorKind::Toolchain);
        assert!(
            err.message().contains("rustup toolchain install duralumin-no-such-toolchain --component rust-src"),
            "{err}"
        );
    }

    #[test]
    fn non_elf_input_is_an_error() {
        assert!(elf_kernels(b"not elf").is_err());
        assert!(elf_kernels(&[]).is_err());
    }
}
