//! Checks of the device code `build.rs` embedded, needing no GPU:
//! * the PTX has every expected entry point and calls nothing it does not define;
//! * `ptxas` (PyPI wheel `nvidia-cuda-nvcc`) assembles it for sm_80 and sm_90 without errors, and
//!   the reduction kernels use no local memory (no stack frame, no spills);
//! * the stream-wait and signal kernels use system-scope acquire loads / release stores;
//! * every AMD code object is an ELF file for its architecture with every expected kernel.
//!
//! Without built kernels (no nightly toolchain) or without `ptxas` these tests print
//! `SKIPPED: ...` and check nothing else, unless `DURALUMIN_REQUIRE_KERNELS=1` (set by
//! `scripts/test.sh`, so CI cannot pass by skipping), where a skip is a failure.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

use duralumin::device_code::{self, KernelModule, KernelName, ReduceKernel, fixed};
use duralumin_kernels::BUILTIN_REDUCE_PAIRS;
use object::elf;
use object::read::elf::{ElfFile64, FileHeader};
use object::{Endianness, Object, ObjectSymbol};

/// Reports a check that could not run: printed as skipped, or a failure where the kernels are
/// required.
fn skip(why: std::fmt::Arguments<'_>) {
    assert!(std::env::var_os("DURALUMIN_REQUIRE_KERNELS").is_none_or(|v| v != "1"), "required but skipped: {why}");
    println!("SKIPPED: {why}");
}

/// Every entry point the builtin module must have.
fn expected_entries() -> BTreeSet<String> {
    let mut names: BTreeSet<String> = fixed::ALL.iter().map(|s| (*s).to_owned()).collect();
    for (element, op) in BUILTIN_REDUCE_PAIRS {
        for kind in ReduceKernel::ALL {
            let name = KernelName::from_parts(kind, element, op);
            assert!(name.is_valid(), "{element}/{op}");
            names.insert(name.as_str().to_owned());
        }
    }
    names
}

/// The builtin module, or `None` (after printing why) when it was not built.
fn built_module(what: &str) -> Option<&'static KernelModule> {
    let module = device_code::builtin();
    if module.ptx.is_none() && module.amdgpu.is_empty() {
        skip(format_args!("{what}: the device kernels were not built: {}", module.unavailable.unwrap_or("unknown")));
        return None;
    }
    Some(module)
}

fn ptx_text(what: &str) -> Option<&'static str> {
    let module = built_module(what)?;
    match module.ptx {
        Some(ptx) => Some(ptx.text),
        None => {
            skip(format_args!("{what}: no PTX was built: {}", module.unavailable.unwrap_or("unknown")));
            None
        }
    }
}

/// The text of the kernel `entry` (its `.entry` line to the closing brace).
fn entry_body<'a>(ptx: &'a str, entry: &str) -> &'a str {
    let start = ptx.find(&format!(".entry {entry}(")).unwrap_or_else(|| panic!("{entry} is not in the PTX"));
    let rest = &ptx[start..];
    let end = rest.find("\n}").map_or(rest.len(), |e| e + 2);
    &rest[..end]
}

#[test]
fn module_lists_every_builtin_kernel() {
    let Some(module) = built_module("entry list") else { return };
    let listed: BTreeSet<String> = module.entries.iter().map(|s| (*s).to_owned()).collect();
    let expected = expected_entries();
    assert_eq!(expected.len(), 3 * 120 + 6);
    assert_eq!(listed, expected);
    assert!(module.unavailable.is_none(), "some targets were not built: {}", module.unavailable.unwrap_or_default());
}

#[test]
fn ptx_has_every_entry_and_no_unresolved_calls() {
    let Some(ptx) = ptx_text("PTX entries") else { return };
    assert!(ptx.contains(".target sm_70"), "the PTX targets sm_70");
    let entries: BTreeSet<String> = ptx
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix(".visible .entry "))
        .map(|rest| rest.split('(').next().unwrap_or_default().trim().to_owned())
        .collect();
    assert_eq!(entries, expected_entries());
    let externs: Vec<&str> = ptx.lines().filter(|l| l.contains(".extern .func")).collect();
    assert!(externs.is_empty(), "the PTX calls undefined functions: {externs:?}");
}

#[test]
fn lookups_find_builtin_kernels_by_the_computed_name() {
    if device_code::builtin().ptx.is_none() {
        // Not built: the lookup is a typed error that says what to install.
        let err = device_code::find_reduce_ptx::<f32, duralumin::Sum>(ReduceKernel::Reduce).unwrap_err();
        let duralumin::Error::KernelsUnavailable(message) = err else { panic!("wrong error: {err}") };
        assert!(message.contains("rustup") && message.contains("rust-src"), "{message}");
        skip(format_args!("lookups of built kernels: the device kernels were not built: {message}"));
        return;
    }
    let kernel = device_code::find_reduce_ptx::<f32, duralumin::Sum>(ReduceKernel::Reduce).unwrap();
    assert_eq!(kernel.entry, "duralumin_reduce_f32_sum");
    assert!(kernel.ptx.text.contains(".entry duralumin_reduce_f32_sum("));
    let kernel = device_code::find_ptx(fixed::STREAM_WAIT).unwrap();
    assert_eq!(kernel.entry, fixed::STREAM_WAIT);
    if let Some(code) = device_code::builtin().amdgpu.first() {
        let found =
            device_code::find_code_object("duralumin_reduce3_bf16_avg", &format!("{}:sramecc+:xnack-", code.target));
        assert_eq!(found.unwrap().code_object.target, code.target);
        assert!(device_code::find_code_object("duralumin_reduce3_bf16_avg", "gfx000").is_err());
    }
}

#[test]
fn flag_kernels_use_system_scope_acquire_and_release() {
    let Some(ptx) = ptx_text("flag atomics") else { return };
    let wait = entry_body(ptx, fixed::STREAM_WAIT);
    assert!(wait.contains("ld.acquire.sys"), "stream-wait must poll with system-scope acquire loads:\n{wait}");
    assert!(wait.contains("nanosleep"), "stream-wait must back off with nanosleep:\n{wait}");
    let signal = entry_body(ptx, fixed::SIGNAL);
    assert!(signal.contains("st.release.sys"), "signal must use a system-scope release store:\n{signal}");
}

#[test]
fn reduce_kernels_use_wide_accesses() {
    let Some(ptx) = ptx_text("wide accesses") else { return };
    for name in
        ["duralumin_reduce_f32_sum", "duralumin_reduce3_u8_bxor", "duralumin_finish_f64_avg", "duralumin_copy_2d"]
    {
        let body = entry_body(ptx, name);
        // 16 bytes: four 32-bit or two 64-bit lanes.
        let wide =
            |op: &str| body.contains(&format!("{op}.global.v4.b32")) || body.contains(&format!("{op}.global.v2.b64"));
        assert!(wide("ld"), "{name} has no 16-byte loads");
        assert!(wide("st"), "{name} has no 16-byte stores");
    }
}

/// `ptxas` from `PTXAS`, `PATH`, CUDA's usual place, or the `nvidia-cuda-nvcc` wheel.
fn find_ptxas() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("PTXAS").map(PathBuf::from).filter(|p| p.is_file()) {
        return Some(p);
    }
    let on_path = std::env::var_os("PATH").into_iter().flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>());
    let cuda = [PathBuf::from("/usr/local/cuda/bin")];
    if let Some(p) = on_path.chain(cuda).map(|d| d.join("ptxas")).find(|p| p.is_file()) {
        return Some(p);
    }
    // The wheel: <site-packages>/nvidia/cu*/bin/ptxas or <site-packages>/nvidia/cuda_nvcc/bin/ptxas.
    let out = Command::new("python3")
        .args(["-c", "import nvidia, os; print('\\n'.join(os.path.abspath(p) for p in nvidia.__path__))"])
        .output()
        .ok()?;
    let roots = String::from_utf8_lossy(&out.stdout).lines().map(PathBuf::from).collect::<Vec<_>>();
    roots
        .iter()
        .flat_map(|root| {
            std::fs::read_dir(root).into_iter().flatten().flatten().map(|e| e.path().join("bin").join("ptxas"))
        })
        .find(|p| p.is_file())
}

/// Per-entry `(registers, stack frame bytes, spill store bytes, spill load bytes)` from `ptxas -v`.
fn parse_ptxas_report(report: &str) -> std::collections::BTreeMap<String, (u32, u32, u32, u32)> {
    let mut out = std::collections::BTreeMap::new();
    let mut current: Option<String> = None;
    let mut frame = (0, 0, 0);
    let number_before = |line: &str, what: &str| -> u32 {
        let i = line.find(what).unwrap_or_else(|| panic!("no '{what}' in {line}"));
        line[..i].split_whitespace().last().and_then(|w| w.parse().ok()).unwrap_or(0)
    };
    for line in report.lines() {
        if let Some(i) = line.find("Function properties for ") {
            current = Some(line[i + "Function properties for ".len()..].trim().to_owned());
        } else if line.contains("bytes stack frame") {
            frame = (
                number_before(line, "bytes stack frame"),
                number_before(line, "bytes spill stores"),
                number_before(line, "bytes spill loads"),
            );
        } else if line.contains("Used ") && line.contains(" registers") {
            if let Some(name) = current.take() {
                let regs = number_before(line, "registers");
                out.insert(name, (regs, frame.0, frame.1, frame.2));
            }
        }
    }
    out
}

#[test]
fn ptxas_assembles_the_ptx_for_sm80_and_sm90_without_spills() {
    let Some(ptx) = ptx_text("ptxas") else { return };
    let Some(ptxas) = find_ptxas() else {
        skip(format_args!("ptxas not found (pip install nvidia-cuda-nvcc, or set PTXAS); the PTX was not assembled"));
        return;
    };
    let dir = std::env::temp_dir().join(format!("duralumin-ptxas-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let input = dir.join("builtin.ptx");
    std::fs::write(&input, ptx).unwrap();
    for arch in ["sm_80", "sm_90"] {
        let output = dir.join(format!("builtin.{arch}.cubin"));
        let result = Command::new(&ptxas)
            .arg(format!("-arch={arch}"))
            .arg("-v")
            .arg(&input)
            .arg("-o")
            .arg(&output)
            .output()
            .unwrap();
        let report = String::from_utf8_lossy(&result.stderr).into_owned() + &String::from_utf8_lossy(&result.stdout);
        assert!(result.status.success(), "ptxas -arch={arch} failed:\n{report}");
        assert!(!report.contains("error"), "ptxas -arch={arch} reported errors:\n{report}");
        let kernels = parse_ptxas_report(&report);
        assert_eq!(kernels.len(), expected_entries().len(), "ptxas reported a different number of kernels");
        let mut max_regs = (0, String::new());
        for (name, &(regs, stack, spill_st, spill_ld)) in &kernels {
            if name.starts_with("duralumin_reduce") || name.starts_with("duralumin_finish") {
                assert_eq!((stack, spill_st, spill_ld), (0, 0, 0), "{name} on {arch} uses local memory");
            }
            if regs > max_regs.0 {
                max_regs = (regs, name.clone());
            }
        }
        // A mover block is 512 threads, and a multiprocessor has 65536 registers: past 128 a
        // thread, its launch would fail for want of them.
        let (mover_regs, mover_stack, ..) = kernels["duralumin_mover"];
        let per_block = 65536 / duralumin_kernels::mover::DEVICE_THREADS;
        assert!(
            mover_regs <= per_block,
            "the mover uses {mover_regs} registers on {arch}: a block of 512 fits {per_block}"
        );
        assert_eq!(mover_stack, 0, "the mover uses a stack on {arch}");
        let (regs, ..) = kernels["duralumin_reduce_f32_sum"];
        println!(
            "{arch}: {} kernels assembled; reduce_f32_sum {regs} registers; most registers: {} ({}); no reduction kernel spills",
            kernels.len(),
            max_regs.1,
            max_regs.0
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

// AMDGPU `e_flags` machine field (LLVM's `llvm/BinaryFormat/ELF.h`; the `object` crate does not
// name them).
const EF_AMDGPU_MACH: u32 = 0x0ff;
const EF_AMDGPU_MACH_AMDGCN_GFX90A: u32 = 0x03f;
const EF_AMDGPU_MACH_AMDGCN_GFX942: u32 = 0x04c;
const EF_AMDGPU_MACH_AMDGCN_GFX1100: u32 = 0x041;

#[test]
fn code_objects_are_elf_files_for_their_architecture_with_every_kernel() {
    let Some(module) = built_module("AMD code objects") else { return };
    let expected = expected_entries();
    let archs: Vec<&str> = module.amdgpu.iter().map(|c| c.target).collect();
    assert_eq!(archs, ["gfx90a", "gfx942", "gfx1100"], "code objects built: {archs:?}");
    for code in module.amdgpu {
        assert_eq!(code.elf.as_ptr() as usize % 16, 0, "{}: the embedded image is not 16-byte aligned", code.target);
        let file =
            ElfFile64::<Endianness>::parse(code.elf).unwrap_or_else(|e| panic!("{}: not ELF64: {e}", code.target));
        let header = file.elf_header();
        let endian = file.endian();
        assert_eq!(header.e_machine(endian), elf::EM_AMDGPU, "{}", code.target);
        assert_eq!(header.e_type(endian), elf::ET_DYN, "{}: a code object is a shared object", code.target);
        let mach = header.e_flags(endian) & EF_AMDGPU_MACH;
        let want = match code.target {
            "gfx90a" => EF_AMDGPU_MACH_AMDGCN_GFX90A,
            "gfx942" => EF_AMDGPU_MACH_AMDGCN_GFX942,
            "gfx1100" => EF_AMDGPU_MACH_AMDGCN_GFX1100,
            other => panic!("unexpected architecture {other}"),
        };
        assert_eq!(mach, want, "{}: e_flags machine", code.target);

        let kernels: BTreeSet<String> =
            file.dynamic_symbols().filter_map(|s| s.name().ok()?.strip_suffix(".kd").map(str::to_owned)).collect();
        assert_eq!(kernels, expected, "{}: kernel descriptors", code.target);
        for name in &expected {
            let function = file.dynamic_symbols().any(|s| s.name() == Ok(name.as_str()) && s.is_definition());
            assert!(function, "{}: {name} has no code", code.target);
        }
    }
}
