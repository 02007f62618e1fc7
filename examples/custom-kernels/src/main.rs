//! Registers this crate's kernels with Duralumin, shows where each one is, and runs the user
//! operators on the host with the same kernel bodies the GPU runs.
//!
//! `cargo run -p duralumin-example-custom-kernels`

use duralumin::device_code::{self, KernelName, ReduceKernel};
use duralumin_example_custom_kernels::{ArgMin, Complex32, KERNELS, MinLoc, register};
use duralumin_kernels::grid::HostGrid;
use duralumin_kernels::{Element, ReduceOp, Sum};

fn show<T: Element, O: ReduceOp<T>>() {
    for kind in ReduceKernel::ALL {
        let name = KernelName::reduce::<T, O>(kind);
        let mut found: Vec<&str> = Vec::new();
        if let Ok(k) = device_code::find_ptx(name.as_str()) {
            found.push(k.ptx.target);
        }
        for code in KERNELS.amdgpu {
            if device_code::find_code_object(name.as_str(), code.target).is_ok() {
                found.push(code.target);
            }
        }
        match found.is_empty() {
            false => println!("  {name}: {}", found.join(", ")),
            true => println!(
                "  {name}: {}",
                device_code::find_ptx(name.as_str()).err().map(|e| e.to_string()).unwrap_or_default()
            ),
        }
    }
}

fn main() -> duralumin::Result<()> {
    register()?;
    println!("module {}: {} kernels", KERNELS.crate_name, KERNELS.entries.len());
    if let Some(reason) = KERNELS.unavailable {
        println!("  not (fully) built: {reason}");
    }
    show::<MinLoc, ArgMin>();
    show::<Complex32, Sum>();

    // Four "ranks" contribute 10 values each; the host device reduces them with the kernel body.
    let ranks: Vec<Vec<MinLoc>> = (0..4u64)
        .map(|r| (0..10u64).map(|i| MinLoc { value: ((i * 7 + r * 3) % 5) as f64, index: r }).collect())
        .collect();
    let mut acc = ranks[0].clone();
    for contribution in &ranks[1..] {
        HostGrid::SINGLE.reduce::<MinLoc, ArgMin>(&mut acc, contribution);
    }
    println!("argmin over 4 ranks: {:?}", &acc[..3]);

    let mut z = vec![Complex32 { re: 1.0, im: -1.0 }; 4];
    HostGrid::SINGLE.reduce::<Complex32, Sum>(&mut z, &[Complex32 { re: 0.5, im: 2.0 }; 4]);
    println!("complex sum: {:?}", z[0]);
    Ok(())
}
