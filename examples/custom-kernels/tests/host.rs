//! The user operators' kernel bodies on the host against a reference, the registry lookups, and
//! the generated PTX (entries, no unresolved calls, `ptxas` for sm_80/sm_90 when installed).

use std::path::PathBuf;
use std::process::Command;

use duralumin::device_code::{self, KernelName, ReduceKernel};
use duralumin_example_custom_kernels::{Affine, ArgMin, Complex32, Compose, KERNELS, MinLoc, register};
use duralumin_kernels::grid::HostGrid;
use duralumin_kernels::{Element, ReduceOp, Sum, bytemuck};

/// Reference argmin, written independently of `ArgMin::combine`: compare (value, index)
/// lexicographically, NaN values last.
fn argmin_reference(a: MinLoc, b: MinLoc) -> MinLoc {
    let key = |m: MinLoc| (m.value.is_nan(), if m.value.is_nan() { 0.0 } else { m.value }, m.index);
    if key(b).partial_cmp(&key(a)) == Some(std::cmp::Ordering::Less) { b } else { a }
}

#[allow(clippy::cast_possible_truncation, reason = "the reference is the exact sum rounded to f32")]
fn complex_reference(a: Complex32, b: Complex32) -> Complex32 {
    let (re, im) = (f64::from(a.re) + f64::from(b.re), f64::from(a.im) + f64::from(b.im));
    Complex32 { re: re as f32, im: im as f32 }
}

/// 16-byte aligned storage, so element offsets give known misalignments.
fn aligned<T: Element>(offset: usize, data: &[T]) -> (Vec<u128>, usize) {
    let bytes = (offset + data.len()) * size_of::<T>();
    let mut storage = vec![0u128; bytes.div_ceil(16) + 1];
    let start = offset * size_of::<T>();
    bytemuck::cast_slice_mut::<u128, u8>(&mut storage)[start..start + size_of_val(data)]
        .copy_from_slice(bytemuck::cast_slice(data));
    (storage, start)
}

fn view<T: Element>(storage: &mut [u128], start: usize, n: usize) -> &mut [T] {
    bytemuck::cast_slice_mut(&mut bytemuck::cast_slice_mut::<u128, u8>(storage)[start..start + n * size_of::<T>()])
}

fn check<T: Element + PartialEq, O: ReduceOp<T>>(make: impl Fn(u64) -> T, reference: impl Fn(T, T) -> T) {
    for n in [0usize, 1, 2, 7, 1001, 100_003] {
        for (dst_off, src_off) in [(0, 0), (1, 1), (1, 0), (3, 2)] {
            for threads in [1, 7, 256] {
                let a: Vec<T> = (0..n as u64).map(&make).collect();
                let b: Vec<T> = (0..n as u64).map(|i| make(i.wrapping_mul(0x9e37_79b9).rotate_left(7))).collect();
                let expected: Vec<T> = a.iter().zip(&b).map(|(&x, &y)| reference(x, y)).collect();
                let (mut dst, ds) = aligned(dst_off, &a);
                let (mut src, ss) = aligned(src_off, &b);
                HostGrid::new(threads).reduce::<T, O>(view(&mut dst, ds, n), view(&mut src, ss, n));
                assert!(
                    view::<T>(&mut dst, ds, n) == &expected[..],
                    "{}/{} reduce n={n} ({dst_off},{src_off})",
                    T::NAME,
                    O::NAME
                );

                let (mut out, os) = aligned(dst_off, &vec![T::zeroed(); n]);
                HostGrid::new(threads).reduce3::<T, O>(view(&mut out, os, n), &a, &b);
                assert!(view::<T>(&mut out, os, n) == &expected[..], "{}/{} reduce3 n={n}", T::NAME, O::NAME);
            }
        }
    }
}

#[test]
fn argmin_matches_the_reference() {
    check::<MinLoc, ArgMin>(
        |i| MinLoc { value: if i % 97 == 5 { f64::NAN } else { ((i * 31) % 13) as f64 - 6.0 }, index: i % 5 },
        argmin_reference,
    );
}

#[test]
fn complex_sum_matches_the_reference() {
    check::<Complex32, Sum>(
        |i| Complex32 { re: (i % 1000) as f32 - 500.0, im: ((i * 7) % 64) as f32 / 4.0 },
        complex_reference,
    );
}

#[test]
fn compose_matches_the_reference() {
    // `g ∘ f` evaluated at 0 and 1 gives its offset and slope.
    let apply = |m: Affine, x: i64| m.a.wrapping_mul(x).wrapping_add(m.b);
    check::<Affine, Compose>(
        |i| {
            let i = i64::try_from(i % 1_000_003).unwrap();
            Affine { a: i % 7 - 3, b: i.wrapping_mul(0x9e37_79b9) }
        },
        |f, g| {
            let b = apply(g, apply(f, 0));
            Affine { a: apply(g, apply(f, 1)).wrapping_sub(b), b }
        },
    );
}

#[test]
fn kernels_are_registered_and_found_by_name() {
    register().unwrap();
    register().unwrap();
    let name = KernelName::reduce::<MinLoc, ArgMin>(ReduceKernel::Reduce);
    assert_eq!(name.as_str(), "duralumin_reduce_minloc_argmin");
    assert_eq!(KernelName::reduce::<Complex32, Sum>(ReduceKernel::Reduce3).as_str(), "duralumin_reduce3_c32_sum");
    if KERNELS.ptx.is_none() {
        println!("SKIPPED: the kernels were not built: {}", KERNELS.unavailable.unwrap_or("unknown"));
        let err = device_code::find_ptx(name.as_str()).unwrap_err();
        assert!(matches!(err, duralumin::Error::KernelsUnavailable(_)));
        return;
    }
    for kind in ReduceKernel::ALL {
        for name in [KernelName::reduce::<MinLoc, ArgMin>(kind), KernelName::reduce::<Complex32, Sum>(kind)] {
            let kernel = device_code::find_ptx(name.as_str()).unwrap();
            assert_eq!(kernel.module.crate_name, "duralumin-example-custom-kernels");
            assert!(kernel.ptx.text.contains(&format!(".entry {name}(")));
            for code in KERNELS.amdgpu {
                assert!(device_code::find_code_object(name.as_str(), code.target).is_ok());
            }
        }
    }
    // The user module holds only its own kernels; the builtin ones stay in the builtin module.
    assert_eq!(KERNELS.entries.len(), 9);
    assert_eq!(KERNELS.amdgpu.len(), 3);
    let builtin = device_code::find_reduce_ptx::<f32, Sum>(ReduceKernel::Reduce).unwrap();
    assert_eq!(builtin.module.crate_name, "duralumin-kernels");
}

fn find_ptxas() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("PTXAS").map(PathBuf::from).filter(|p| p.is_file()) {
        return Some(p);
    }
    let out = Command::new("python3")
        .args(["-c", "import nvidia, os; print('\\n'.join(os.path.abspath(p) for p in nvidia.__path__))"])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .flat_map(|root| {
            std::fs::read_dir(root).into_iter().flatten().flatten().map(|e| e.path().join("bin").join("ptxas"))
        })
        .chain(std::env::var_os("PATH").iter().flat_map(std::env::split_paths).map(|d| d.join("ptxas")))
        .find(|p| p.is_file())
}

#[test]
fn ptx_is_self_contained_and_assembles() {
    let Some(ptx) = KERNELS.ptx else {
        println!("SKIPPED: no PTX was built: {}", KERNELS.unavailable.unwrap_or("unknown"));
        return;
    };
    assert!(!ptx.text.contains(".extern .func"), "the PTX calls undefined functions");
    let Some(ptxas) = find_ptxas() else {
        println!("SKIPPED: ptxas not found (pip install nvidia-cuda-nvcc, or set PTXAS)");
        return;
    };
    let path = std::env::temp_dir().join(format!("custom-kernels-{}.ptx", std::process::id()));
    std::fs::write(&path, ptx.text).unwrap();
    for arch in ["sm_80", "sm_90"] {
        let out = Command::new(&ptxas)
            .arg(format!("-arch={arch}"))
            .arg("-v")
            .arg(&path)
            .arg("-o")
            .arg("/dev/null")
            .output()
            .unwrap();
        let report = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "ptxas {arch}:\n{report}");
        for line in report.lines().filter(|l| l.contains("bytes stack frame")) {
            assert_eq!(
                line.trim(),
                "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads",
                "{arch}:\n{report}"
            );
        }
    }
    let _ = std::fs::remove_file(&path);
}
