//! `duralumin-perf`: nccl-tests' `*_perf` programs for Duralumin (`docs/perf.md`). Run it under
//! `mpirun` (or `srun`, or `scripts/cluster.sh mpirun`); `--help` lists the flags. The exit
//! code is 0 when every checked result was right, 1 when any was wrong, 2 for bad flags and 3
//! when a run failed.

use std::path::Path;
use std::process::ExitCode;

use duralumin::MpiCommunicator;
use duralumin::mpi::topology::{Communicator as _, SimpleCommunicator};
use duralumin_perf::args::{Args, USAGE};
use duralumin_perf::table::{self, Row};
use duralumin_perf::targets::{HtHost, Mpi};
use duralumin_perf::{Boxed, plot, run, trace};

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let a = match Args::parse(&argv) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("duralumin-perf: {e}");
            return ExitCode::from(2);
        }
    };
    if a.help {
        print!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    match perf(&a) {
        Ok(0) => ExitCode::SUCCESS,
        Ok(_) => ExitCode::from(1),
        Err(e) => {
            eprintln!("duralumin-perf: {e}");
            ExitCode::from(3)
        }
    }
}

/// Runs `$body` with `$t` the element type nccl-tests' name `$name` gives.
macro_rules! with_dtype {
    ($name:expr, $t:ident => $body:expr) => {
        match $name {
            "int8" => {
                type $t = i8;
                $body
            }
            "uint8" => {
                type $t = u8;
                $body
            }
            "int32" => {
                type $t = i32;
                $body
            }
            "uint32" => {
                type $t = u32;
                $body
            }
            "int64" => {
                type $t = i64;
                $body
            }
            "uint64" => {
                type $t = u64;
                $body
            }
            "half" => {
                type $t = duralumin::half::f16;
                $body
            }
            "bfloat16" => {
                type $t = duralumin::half::bf16;
                $body
            }
            "float" => {
                type $t = f32;
                $body
            }
            "double" => {
                type $t = f64;
                $body
            }
            other => Err(format!("-d: unknown type '{other}'").into()),
        }
    };
}

/// Every backend's rows; the total of wrong elements.
fn perf(a: &Args) -> Result<u64, Boxed> {
    let universe = duralumin::init()?;
    let world = universe.world();
    let (rank, np) = (usize::try_from(world.rank())?, usize::try_from(world.size())?);
    let _trace = trace::install(a.trace.as_ref().map(|p| trace::rank_path(Path::new(p), rank)).as_deref(), a.nvtx)?;
    if rank == 0 {
        println!(
            "# duralumin-perf: {np} ranks, {} on {}, {} iterations ({} warm-up), check {}",
            a.backends.join(", "),
            a.device,
            a.iters,
            a.warmup,
            u8::from(a.check),
        );
        println!(
            "# MPI: {}",
            duralumin::mpi::environment::library_version()
                .unwrap_or_default()
                .trim_end_matches('\0')
                .lines()
                .next()
                .unwrap_or("")
        );
    }
    if a.span_cost {
        return span_cost(a, &world, rank, np);
    }
    let mut rows: Vec<Row> = Vec::new();
    for backend in &a.backends {
        // The Mpi backend's calls complete before they return; the others queue on a stream.
        let enqueue = backend != "mpi";
        let mode = match (enqueue, a.blocking_on(enqueue)) {
            (false, true) => "blocking calls (-z 1)".to_string(),
            (false, false) => format!(
                "non-blocking calls, up to {} started at once on their own buffers, then waited for (-z 0)",
                run::WINDOW
            ),
            (true, true) => "calls queued, stream synchronized after each (-z 1)".to_string(),
            (true, false) => "calls queued, stream synchronized once (-z 0)".to_string(),
        };
        if rank == 0 {
            println!("#\n# {backend} ({}): {mode}\n{}", a.device, table::header(enqueue, a.native));
        }
        let mut out = |row: Row| {
            if rank == 0 {
                println!("{}", table::line(&row, enqueue, a.native));
            }
            rows.push(row);
        };
        let mut skip = |msg: String| {
            if rank == 0 {
                println!("# skipped: {msg}");
            }
        };
        backend_rows(a, &world, backend, &mut out, &mut skip)?;
    }
    if rank == 0 {
        println!("{}", table::summary(&rows));
        write_outputs(a, &rows, np)?;
    }
    Ok(table::wrong_total(&rows))
}

/// `--span-cost`: the table of [`run::span_cost`].
fn span_cost(a: &Args, world: &SimpleCommunicator, rank: usize, np: usize) -> Result<u64, Boxed> {
    const ROUNDS: usize = 11;
    let (on, off) = run::span_cost(world, a, ROUNDS)?;
    if rank == 0 {
        println!(
            "# span cost: 4 B f32 allreduce, Mpi backend, {np} ranks, no subscriber; median of {ROUNDS} rounds of {} calls",
            a.iters
        );
        println!("#{:>22} {:>12}", "spans", "time (us)");
        println!(" {:>22} {on:>12.4}", "on");
        println!(" {:>22} {off:>12.4}", "off");
        println!(" {:>22} {:>12.4}", "cost per operation", on - off);
    }
    Ok(0)
}

/// [`run::sweep`] on `t` with the element type `-d` names.
fn sweep_dtype<X: duralumin_perf::targets::Target>(
    t: &X,
    world: &SimpleCommunicator,
    a: &Args,
    out: &mut dyn FnMut(Row),
    skip: &mut dyn FnMut(String),
) -> Result<(), Boxed> {
    with_dtype!(a.dtype.as_str(), T => run::sweep::<_, T>(t, world, a, out, skip))
}

/// The rows of one backend on `--device`.
fn backend_rows(
    a: &Args,
    world: &SimpleCommunicator,
    backend: &str,
    out: &mut dyn FnMut(Row),
    skip: &mut dyn FnMut(String),
) -> Result<(), Boxed> {
    match (backend, a.device.as_str()) {
        ("mpi", "host") => {
            let t = Mpi(MpiCommunicator::new(world)?);
            sweep_dtype(&t, world, a, out, skip)
        }
        ("host-transfer", "host") => {
            let t = HtHost::new(world)?;
            sweep_dtype(&t, world, a, out, skip)
        }
        #[cfg(feature = "cuda")]
        ("host-transfer", "cuda") => {
            let t = duralumin_perf::targets::HtCuda::new(world, local_rank(world)?)?;
            sweep_dtype(&t, world, a, out, skip)
        }
        #[cfg(feature = "cuda")]
        ("nccl", "cuda") => {
            let t = duralumin_perf::targets::Nccl::new(world, local_rank(world)?)?;
            sweep_dtype(&t, world, a, out, skip)
        }
        ("mpi", _) => Err("the Mpi backend works on host memory: use --device host".into()),
        ("nccl", "host") => Err("NCCL works on CUDA memory: use --device cuda".into()),
        (b, d) => Err(format!("--backend {b} --device {d}: not built in (the cuda feature is off)").into()),
    }
}

/// This rank's index among the ranks of its node (which GPU it takes).
#[cfg(feature = "cuda")]
fn local_rank(world: &SimpleCommunicator) -> Result<usize, Boxed> {
    let c = MpiCommunicator::new(world)?;
    Ok(c.topology().local_index(c.rank()))
}

/// `--csv`, `--json` and `--plot`, from rank 0.
fn write_outputs(a: &Args, rows: &[Row], np: usize) -> Result<(), Boxed> {
    let write = |path: &str, text: String| std::fs::write(path, text).map_err(|e| format!("{path}: {e}"));
    if let Some(p) = &a.csv {
        write(p, table::csv(rows))?;
    }
    if let Some(p) = &a.json {
        write(p, serde_json::to_string_pretty(&table::json(rows))?)?;
    }
    if let Some(p) = &a.plot {
        let ops: Vec<&str> = a.colls.iter().map(|c| c.name()).collect();
        let title = format!("{}, {np} ranks, {}", ops.join(", "), a.dtype);
        plot::plot(Path::new(p), &title, &plot::series_of(rows))?;
    }
    Ok(())
}
