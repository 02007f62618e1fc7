//! Property-based test of the argument checks: random counts, displacements, roots, peers,
//! tags and buffer lengths for every collective with such arguments (and sendrecv), on the Mpi
//! backend, on HostTransfer over the host device and on NCCL over cudasim's device and its
//! NCCL (ncclsim), blocking and non-blocking, with and without the signature check (NCCL has
//! none: it gets the cases that need none, valid ones and those every rank refuses).
//!
//! Every rank draws the same cases (proptest with a fixed ChaCha seed, no shrinking: a case is
//! one collective call, so all ranks must make their calls in the same order), so each rank
//! knows every rank's arguments and computes the outcome sequentially (`case.rs`): a case is
//! built valid, then maybe spoiled on one rank or on all. A case must either match the
//! reference on every rank, or end in a typed error on every rank: the error the rank's own
//! checks give where its arguments are wrong (any of the checks they fail), and
//! [`duralumin::Error::SignatureMismatch`] on the others. A spoiled argument that only some
//! ranks would notice (or that every rank accepts but that does not match the others') is drawn
//! with the signature check on, which must turn it into an error on every rank rather than a
//! hang or a truncation. Nothing may panic (the library's panic hook would end the job) and
//! nothing may hang (a deadline per operation, and one per launch).
//!
//! After each case the ranks compare verdicts over a communicator of their own, so a case the
//! model disagrees with fails on every rank at once and the launch ends.
//!
//! Run under `mpirun` at 1 to 5 ranks, one launch each with a hard limit.
// Test values are cut from counters, ranks and random numbers on purpose (all small, or
// wanted modulo the type): the cast lints are noise here.
#![allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]

mod case;
mod exec;
#[path = "../common/mpirun.rs"]
mod mpirun;

use std::cell::RefCell;
use std::time::Duration;

use duralumin::cudarc::driver::CudaContext;
use duralumin::device::cpu::HostDevice;
use duralumin::device::cuda::CudaDevice;
use duralumin::{Error, MpiCommunicator, NcclCommunicator, Tuning};
use duralumin::{HostTransferCommunicator, HostTransferConfig};
use libtest_mimic::{Arguments, Failed, Trial};
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestCaseResult, TestRng, TestRunner};

use case::{Backend, Case};

/// Cases per launch.
const CASES: u32 = 512;
/// The hard limit of one launch.
const LIMIT: Duration = Duration::from_secs(60);

fn main() {
    if std::env::var("DURALUMIN_ARGCHECK_PROGRAM").is_ok() {
        std::process::exit(rank_main());
    }
    let mut args = Arguments::from_args();
    // The launches share the machine's cores: one at a time.
    args.test_threads = Some(1);
    let trials = (1..=5).map(|np| Trial::test(format!("argcheck_np{np}"), move || launch(np))).collect();
    libtest_mimic::run(&args, trials).exit();
}

fn launch(np: usize) -> Result<(), Failed> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    // A hang ends with the ranks' report naming the operation, well within the launch's limit.
    let mut env = vec![("DURALUMIN_ARGCHECK_PROGRAM", "1".to_string()), ("DURALUMIN_TIMEOUT", "10".to_string())];
    // DURALUMIN_ARGCHECK_TRACE=1: every rank prints each case before it runs it;
    // DURALUMIN_ARGCHECK_SEED and DURALUMIN_ARGCHECK_CASES draw other cases, or more.
    for k in ["DURALUMIN_ARGCHECK_TRACE", "DURALUMIN_ARGCHECK_SEED", "DURALUMIN_ARGCHECK_CASES"] {
        if let Ok(v) = std::env::var(k) {
            env.push((k, v));
        }
    }
    // The NCCL cases need the CUDA driver simulator (its NCCL, ncclsim); without it they run on
    // HostTransfer, unless DURALUMIN_REQUIRE_CUDASIM=1 (scripts/test.sh) makes that a failure.
    match mpirun::cudasim_dir() {
        Some(dir) => {
            env.push(("LD_LIBRARY_PATH", mpirun::library_path_with(&dir)));
            env.push(("DURALUMIN_ARGCHECK_NCCL", "1".to_string()));
        }
        None if std::env::var("DURALUMIN_REQUIRE_CUDASIM").is_ok_and(|v| v == "1") => {
            return Err("the CUDA driver simulator is not built: cargo build --release -p duralumin-cudasim".into());
        }
        None => println!("argcheck np {np}: no CUDA driver simulator, so no NCCL cases (they run on HostTransfer)"),
    }
    let run = mpirun::launch(np, &exe, &env, &[], LIMIT)?;
    match run.status {
        Some(s) if s.success() => {
            for line in run.stdout.lines().filter(|l| l.starts_with("ARGCHECK")) {
                println!("{line}");
            }
            println!("argcheck np {np}: {:.1?}", run.elapsed);
            Ok(())
        }
        Some(s) => Err(run.failure(&format!("mpirun -np {np} failed ({s})")).into()),
        None => Err(run.failure(&format!("mpirun -np {np} still running after {LIMIT:?}: killed")).into()),
    }
}

/// What rank `me` must get from `case`.
enum Expect {
    Result(Vec<u64>),
    /// One of these errors.
    Error(Vec<&'static str>),
}

fn expectation(case: &Case, me: usize) -> Expect {
    if case.valid() {
        return Expect::Result(case.expected(me));
    }
    let mine = case.violations(me);
    if !mine.is_empty() || !case.check || case.n == 1 || !case.op.collective() {
        // The case generator only leaves the check off where every rank refuses.
        return Expect::Error(mine);
    }
    Expect::Error(vec!["SignatureMismatch"])
}

/// How the cases went, by kind.
#[derive(Debug, Default)]
struct Tally {
    cases: usize,
    valid: usize,
    refused_everywhere: usize,
    /// Refused on some ranks only, or accepted everywhere but mismatched: the signature check.
    caught_by_check: usize,
    host_transfer: usize,
    nccl: usize,
    nonblocking: usize,
    check_on: usize,
}

struct Comms {
    mpi: MpiCommunicator,
    ht: HostTransferCommunicator<HostDevice>,
    dev: HostDevice,
    /// On cudasim's device, where the run has it.
    nccl: Option<NcclCommunicator<CudaDevice>>,
    /// Where the ranks compare verdicts (never given a bad argument).
    verdict: MpiCommunicator,
}

/// What `in_flight` says once it is 0, or after 10 s.
fn settled(in_flight: impl Fn() -> usize) -> usize {
    let start = std::time::Instant::now();
    loop {
        let k = in_flight();
        if k == 0 || start.elapsed() >= Duration::from_secs(10) {
            return k;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// One case on this rank, then the verdicts of all ranks.
fn one(comms: &RefCell<Comms>, tally: &RefCell<Tally>, me: usize, case: Case) -> TestCaseResult {
    let c = &mut *comms.borrow_mut();
    let _case = mpirun::rank_case::enter(format!(
        "case {}: {:?} {:?}{}{}, this rank's arguments {:?}{}",
        tally.borrow().cases + 1,
        case.backend,
        case.op,
        if case.nonblocking { " non-blocking" } else { "" },
        if case.check { ", signature check on" } else { "" },
        case.args[me],
        case.mutation.as_ref().map(|m| format!(", spoiled: {m:?}")).unwrap_or_default(),
    ));
    if std::env::var("DURALUMIN_ARGCHECK_TRACE").is_ok() {
        eprintln!("rank {me}: case {}: {case:?}", tally.borrow().cases + 1);
    }
    let (outcome, in_flight, aborted) = match case.backend {
        Backend::Mpi => {
            c.mpi.set_check(case.check);
            let out = exec::mpi(&c.mpi, &case, me, case.nonblocking);
            (out, c.mpi.ops_in_flight(), c.mpi.is_aborted())
        }
        Backend::HostTransfer => {
            c.ht.set_check(case.check);
            let out = exec::ht(&c.ht, &c.dev, &case, me, case.nonblocking);
            // An operation that copies nothing back (a bcast at its root) releases the stream
            // before its MPI part is through: give the proxy thread a moment to finish it.
            (out, settled(|| c.ht.ops_in_flight()), c.ht.is_aborted())
        }
        Backend::Nccl => {
            let Some(nccl) = &c.nccl else {
                return Err(TestCaseError::fail("an NCCL case without an NCCL communicator"));
            };
            // Synchronized before it returns: nothing stays in flight.
            let out = exec::nccl(nccl, &case, me, case.nonblocking);
            (out, 0, nccl.is_aborted())
        }
    };
    let verdict = match (&outcome, expectation(&case, me)) {
        _ if aborted => Err("the communicator was given up".to_string()),
        _ if in_flight > 0 => Err(format!("{in_flight} operations still in flight")),
        (Ok(got), Expect::Result(want)) if *got == want => Ok(()),
        (Ok(got), Expect::Result(want)) => Err(format!("got {got:?}, the reference is {want:?}")),
        (Ok(_), Expect::Error(kinds)) => Err(format!("succeeded, but the model expects one of {kinds:?}")),
        (Err(e), Expect::Error(kinds)) if kinds.contains(&exec::kind(e)) => Ok(()),
        (Err(e), Expect::Error(kinds)) => {
            Err(format!("{} ({e}), but the model expects one of {kinds:?}", exec::kind(e)))
        }
        (Err(e), Expect::Result(_)) => Err(format!("{} ({e}) on a valid case", exec::kind(e))),
    };
    let n = case.n;
    let mut all = vec![0u8; n];
    c.verdict.allgather(&[u8::from(verdict.is_ok())], &mut all).expect("the verdict exchange");
    let wrong: Vec<usize> = (0..n).filter(|&r| all[r] == 0).collect();
    let mut t = tally.borrow_mut();
    t.cases += 1;
    if let Err(why) = &verdict {
        println!("ARGCHECK rank {me}: case {}: {why}", t.cases);
    }
    if !wrong.is_empty() {
        let mine = verdict.err().unwrap_or_else(|| "as the model expects".into());
        return Err(TestCaseError::fail(format!(
            "case {} differs from the model on ranks {wrong:?} (here, rank {me}: {mine}): {case:#?}",
            t.cases
        )));
    }
    let refused = (0..n).filter(|&r| !case.violations(r).is_empty()).count();
    match () {
        _ if case.valid() => t.valid += 1,
        _ if refused == n => t.refused_everywhere += 1,
        _ => t.caught_by_check += 1,
    }
    t.host_transfer += usize::from(case.backend == Backend::HostTransfer);
    t.nccl += usize::from(case.backend == Backend::Nccl);
    t.nonblocking += usize::from(case.nonblocking);
    t.check_on += usize::from(case.check);
    Ok(())
}

/// The rank program; returns the exit code.
fn rank_main() -> i32 {
    let universe = duralumin::init().expect("MPI init");
    let world = universe.world();
    let mut mpi = MpiCommunicator::new(&world).expect("communicator");
    // Low thresholds: larger cases take Duralumin's own algorithms and split messages.
    mpi.set_tuning(
        Tuning::default()
            .with_allreduce_ring_bytes(64)
            .with_ring_segment_bytes(16)
            .with_reduce_ring_bytes(64)
            .with_reduce_root_ring_bytes(64)
            .with_bcast_chain_bytes(64)
            .with_bcast_chunk_bytes(16)
            .with_max_message_elements(6),
    );
    let mut verdict = MpiCommunicator::new(&world).expect("communicator");
    verdict.set_check(false);
    let dev = HostDevice::new(0);
    // Staged in chunks of a few elements, so cases pipeline.
    let config = HostTransferConfig::default().with_chunk_bytes(64).with_direct(false);
    let ht = HostTransferCommunicator::with_config(&world, dev.clone(), dev.stream().expect("stream"), config)
        .expect("HostTransfer communicator");
    let nccl = std::env::var("DURALUMIN_ARGCHECK_NCCL").is_ok_and(|v| v == "1").then(|| {
        let ctx = CudaContext::new(0).expect("CUDA context (cudasim)");
        let stream = ctx.new_stream().expect("stream");
        NcclCommunicator::from_stream(&world, stream).expect("NCCL communicator (ncclsim)")
    });
    let (me, n) = (mpi.rank(), mpi.size());
    mpirun::rank_case::start(me);
    let with_nccl = nccl.is_some();
    let comms = RefCell::new(Comms { mpi, ht, dev, nccl, verdict });
    let tally = RefCell::new(Tally::default());

    // The same seed on every rank (and another one for each rank count).
    let var = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
    let mut seed = *b"duralumin argument checks seed 0";
    seed[31] = n as u8;
    seed[..8].copy_from_slice(&var("DURALUMIN_ARGCHECK_SEED").unwrap_or(0).to_le_bytes());
    let cases = var("DURALUMIN_ARGCHECK_CASES").map_or(CASES, |c| c as u32);
    let config = Config { cases, failure_persistence: None, max_shrink_iters: 0, ..Config::default() };
    let mut runner = TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &seed));
    let result = runner.run(&case::cases(n, with_nccl), |case| one(&comms, &tally, me, case));
    let t = tally.into_inner();
    let code = match result {
        Ok(()) => {
            if me == 0 {
                println!(
                    "ARGCHECK np {n}: {} cases: {} valid, {} refused on every rank, {} refused on some ranks or \
                     mismatched (signature check); {} on HostTransfer, {} on NCCL, {} non-blocking, {} with the \
                     check on",
                    t.cases,
                    t.valid,
                    t.refused_everywhere,
                    t.caught_by_check,
                    t.host_transfer,
                    t.nccl,
                    t.nonblocking,
                    t.check_on
                );
            }
            0
        }
        Err(e) => {
            println!("ARGCHECK rank {me}: FAILED: {e}");
            1
        }
    };
    let comms = comms.into_inner();
    // The communicators still work after every refused case.
    comms.mpi.barrier().unwrap_or_else(|e: Error| panic!("rank {me}: barrier after the cases: {e}"));
    drop(comms);
    drop(universe);
    code
}
