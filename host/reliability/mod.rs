//! Failure behaviour: nothing hangs silently.
//!
//! * A panic ends the whole job ([`OnPanic`]), so no rank waits for one that is gone.
//! * Every operation has a deadline (10 minutes unless `DURALUMIN_TIMEOUT` or
//!   `set_timeout` says otherwise). Past it, the ranks exchange their flight recorders and every
//!   rank that can prints a report naming the ranks out of step; then the job is aborted, or
//!   the communicator given up and the error returned ([`OnTimeout`]).
//! * With the signature check (`DURALUMIN_CHECK=1` or `set_check`), ranks compare each
//!   collective's signature before any data moves: a mismatch is an error on every rank.
//! * On an MPI library with ULFM, a failed process is an error on the survivors, and
//!   `revoke`/`shrink` rebuild the communicator.
//!
//! The guarantees, the report format and the recovery model are in `docs/reliability.md`.

pub(crate) mod abort;
pub(crate) mod crosscheck;
pub(crate) mod monitor;
pub(crate) mod recorder;
pub(crate) mod report;
pub(crate) mod spans;
pub(crate) mod watchdog;

use std::time::Duration;

use crate::api::error::{Error, Result};
use crate::api::request::DeferredError;
use crosscheck::Pairs;
use monitor::{Monitor, OpId};
use recorder::{Signature, State};

/// Turns the operations' `tracing` spans off for this process (or back on; they are on by
/// default, and cost a cached check while no subscriber wants them). Hidden: it exists so that
/// `duralumin-perf --span-cost` can time operations with and without them in one run.
#[doc(hidden)]
pub fn set_operation_spans(on: bool) {
    spans::set_enabled(on);
}

/// What a panic does once MPI is initialized (`DURALUMIN_ON_PANIC=abort|unwind`, or
/// [`InitOptions::on_panic`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnPanic {
    /// After the usual message, print `rank R: panic, aborting the job` and end every process
    /// of the job (`MPI_Abort`). A panic in one rank would otherwise leave the others waiting
    /// in their next collective for ever.
    #[default]
    Abort,
    /// Unwind as Rust does; the program is responsible for the other ranks. A panic inside an
    /// operation on the progress thread, or inside an MPI reduction callback, still ends the
    /// job: it cannot unwind there, and the collective it interrupted would never end.
    Unwind,
}

/// What a communicator does when an operation runs past its deadline, or a collective fails in
/// a way that leaves the other ranks waiting (an MPI error inside it, a count mismatch)
/// (`DURALUMIN_ON_TIMEOUT=abort|error`, or `set_on_timeout`). Either way the desync report is
/// printed first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[repr(u8)]
pub enum OnTimeout {
    /// End every process of the job (`MPI_Abort`): the only way to free what the MPI library
    /// holds for an operation that will never end.
    #[default]
    Abort = 0,
    /// Return the error ([`Error::Timeout`] to the operation that ran past its deadline) and
    /// give the communicator up: every later call on it fails at once with [`Error::Aborted`],
    /// operations in flight complete with it, and other ranks asked for their recorder give
    /// it up too. Without ULFM, operations then run on memory the library owns, through MPI's
    /// non-blocking calls, so one can be abandoned safely (see `docs/reliability.md` for the
    /// cost); HostTransfer raises every flag its streams wait on (their outputs are
    /// undefined).
    Error = 1,
}

/// Options of [`crate::init_with`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct InitOptions {
    on_panic: Option<OnPanic>,
    independent_tasks: bool,
}

impl InitOptions {
    /// The defaults (`DURALUMIN_ON_PANIC`, else [`OnPanic::Abort`]).
    pub fn new() -> Self {
        InitOptions::default()
    }

    /// What panics do, whatever `DURALUMIN_ON_PANIC` says.
    pub fn on_panic(self, on_panic: OnPanic) -> Self {
        InitOptions { on_panic: Some(on_panic), ..self }
    }

    /// Allows a launch in which each of the launcher's tasks is an MPI job of its own (see
    /// [`Error::UnwiredLaunch`]): for a job step that runs
    /// independent single-rank programs on purpose.
    pub fn independent_tasks(self) -> Self {
        InitOptions { independent_tasks: true, ..self }
    }

    pub(crate) fn requested_on_panic(&self) -> Option<OnPanic> {
        self.on_panic
    }

    /// Whether a launch of independent single-rank tasks is allowed: by
    /// [`InitOptions::independent_tasks`], or `DURALUMIN_INDEPENDENT_TASKS=1`.
    pub(crate) fn allows_independent_tasks(&self) -> bool {
        self.independent_tasks || std::env::var("DURALUMIN_INDEPENDENT_TASKS").is_ok_and(|v| v == "1")
    }
}

/// Whether the running MPI library has ULFM (`MPIX_Comm_revoke`, `_agree`, `_shrink`,
/// `_failure_ack`), looked up at run time: `revoke`, `agree` and `shrink` need it.
pub fn ulfm_available() -> bool {
    crate::ffi::ulfm::available()
}

/// The settings a new communicator starts with, from the environment.
#[derive(Clone, Copy, Debug)]
pub(crate) struct EnvSettings {
    pub(crate) timeout: Option<Duration>,
    pub(crate) on_timeout: OnTimeout,
    pub(crate) check: bool,
    pub(crate) recorder_ops: usize,
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().map(|v| v.trim().to_ascii_lowercase()).filter(|v| !v.is_empty())
}

impl EnvSettings {
    /// `DURALUMIN_TIMEOUT` (seconds, fractions allowed; 0 turns deadlines off),
    /// `DURALUMIN_ON_TIMEOUT`, `DURALUMIN_CHECK` (`1`/`0`) and `DURALUMIN_RECORDER_OPS`; a value
    /// that cannot be read is an [`Error::InvalidConfig`].
    pub(crate) fn read() -> Result<EnvSettings> {
        let timeout = match var("DURALUMIN_TIMEOUT") {
            None => Some(monitor::DEFAULT_TIMEOUT),
            Some(v) => match v.parse::<f64>() {
                Ok(0.0) => None,
                Ok(s) if s.is_finite() && s > 0.0 => Some(Duration::from_secs_f64(s.min(1e9))),
                _ => return Err(Error::InvalidConfig("DURALUMIN_TIMEOUT must be a number of seconds (0: none)")),
            },
        };
        let on_timeout = match var("DURALUMIN_ON_TIMEOUT").as_deref() {
            None | Some("abort") => OnTimeout::Abort,
            Some("error") => OnTimeout::Error,
            Some(_) => return Err(Error::InvalidConfig("DURALUMIN_ON_TIMEOUT must be abort or error")),
        };
        let check = match var("DURALUMIN_CHECK").as_deref() {
            None | Some("0") | Some("false") | Some("off") => false,
            Some("1") | Some("true") | Some("on") => true,
            Some(_) => return Err(Error::InvalidConfig("DURALUMIN_CHECK must be 1 or 0")),
        };
        let recorder_ops = match var("DURALUMIN_RECORDER_OPS") {
            None => recorder::DEFAULT_OPS,
            Some(v) => match v.parse::<usize>() {
                Ok(n) if (8..=4096).contains(&n) => n,
                _ => return Err(Error::InvalidConfig("DURALUMIN_RECORDER_OPS must be 8 to 4096")),
            },
        };
        Ok(EnvSettings { timeout, on_timeout, check, recorder_ops })
    }
}

/// `DURALUMIN_ON_PANIC`, if set.
pub(crate) fn env_on_panic() -> Result<Option<OnPanic>> {
    match var("DURALUMIN_ON_PANIC").as_deref() {
        None => Ok(None),
        Some("abort") => Ok(Some(OnPanic::Abort)),
        Some("unwind") => Ok(Some(OnPanic::Unwind)),
        Some(_) => Err(Error::InvalidConfig("DURALUMIN_ON_PANIC must be abort or unwind")),
    }
}

/// Plans an operation that was begun ([`Monitor::begin`]): an error an earlier request left
/// (`errors`), then the plan's own argument checks, then, in check mode, the signature check,
/// which every rank runs whether its own arguments passed or not, so a bad argument on one rank
/// is an error on all. A refused operation is recorded as such.
pub(crate) fn prepare<P>(
    m: &Monitor,
    errors: &DeferredError,
    op: OpId,
    sig: &Signature,
    pairs: Option<Pairs>,
    plan: &mut dyn FnMut() -> Result<P>,
) -> Result<P> {
    match errors.check().and_then(|()| plan()) {
        Ok(planned) => agree(m, op, sig, pairs, Ok(())).map(|()| planned),
        Err(e) => Err(agree(m, op, sig, pairs, Err(e))
            .err()
            .unwrap_or(Error::Progress("the signature check passed an operation without a plan"))),
    }
}

/// The part of [`prepare`] after the plan: the signature check in check mode, and the record
/// of a refusal. Not generic and not inlined: `prepare` is instantiated for every operation,
/// element and operator (about ten thousand copies in the test suite), and this is about a
/// third of each copy's code.
#[inline(never)]
fn agree(m: &Monitor, op: OpId, sig: &Signature, pairs: Option<Pairs>, local: Result<()>) -> Result<()> {
    let ready = if m.checks(sig) { crosscheck::run(m, op, sig, pairs, local) } else { local };
    let ready = ready.map_err(|e| m.named(op, e));
    if let Err(e) = &ready {
        if m.poisoned().is_none() {
            m.set(op, State::Rejected, Some(e.to_string()));
        }
    }
    ready
}
