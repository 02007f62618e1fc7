//! The sweep's cases by name, and failures injected into them on purpose.
//!
//! Every case the sweep runs is a [`Case`]: operation, non-blocking or not, in place or not,
//! element type, operator, count, root and algorithm where they apply. [`Case::enter`] makes
//! it where this rank is (see `common/rank_case.rs`), so whatever fails inside (a result the
//! checks refuse, an error the operation returns, a panic in the library, a hang) is reported
//! with it, as `rank 2: group sweep / Mpi / allreduce in place, f32, Sum, count 7, algorithm
//! Auto: got [...], expected [...]`.
//!
//! `DURALUMIN_TEST_BREAK=<how>:rank=<r>,<field>=<value>,...` breaks the first case on rank `r`
//! whose fields match (`op`, `type`, `operator`, `count`, `root`, `algorithm`, `nb`,
//! `in_place`; names as the case shows them, any letter case): `wrong` corrupts one expected
//! value, so the check fails there; `hang` stops the rank at the case, before the operation, so
//! the others wait in it. Only this test harness reads it (the launcher's `names_*` trials
//! prove that failures are named).

use std::fmt;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use duralumin::{AllreduceAlgorithm, BcastAlgorithm, Element, ReduceOp, Result};

use crate::elements::same;
use crate::mpirun::rank_case;

/// The variable that injects a failure.
pub const BREAK: &str = "DURALUMIN_TEST_BREAK";

/// One case of the sweep.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub op: &'static str,
    pub nb: bool,
    pub in_place: bool,
    pub elem: &'static str,
    pub operator: Option<&'static str>,
    pub count: usize,
    pub root: Option<usize>,
    pub algorithm: Option<Algorithm>,
}

/// The algorithm a case asks for.
#[derive(Clone, Copy, Debug)]
pub enum Algorithm {
    Allreduce(AllreduceAlgorithm),
    Bcast(BcastAlgorithm),
}

impl From<AllreduceAlgorithm> for Algorithm {
    fn from(a: AllreduceAlgorithm) -> Algorithm {
        Algorithm::Allreduce(a)
    }
}

impl From<BcastAlgorithm> for Algorithm {
    fn from(a: BcastAlgorithm) -> Algorithm {
        Algorithm::Bcast(a)
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Algorithm::Allreduce(a) => write!(f, "{a:?}"),
            Algorithm::Bcast(a) => write!(f, "{a:?}"),
        }
    }
}

/// A type's name without its path (`f16`, not `half::binary16::f16`).
fn short_name<T>() -> &'static str {
    let full = std::any::type_name::<T>();
    full.rsplit("::").next().unwrap_or(full)
}

impl Case {
    /// A data-movement case.
    pub fn movement<T: Element>(op: &'static str, count: usize, nb: bool, in_place: bool) -> Case {
        Case { op, nb, in_place, elem: short_name::<T>(), operator: None, count, root: None, algorithm: None }
    }

    /// A reduction case.
    pub fn reduction<T: Element, O: ReduceOp<T>>(op: &'static str, count: usize, nb: bool, in_place: bool) -> Case {
        Case { operator: Some(short_name::<O>()), ..Case::movement::<T>(op, count, nb, in_place) }
    }

    pub fn root(self, root: usize) -> Case {
        Case { root: Some(root), ..self }
    }

    pub fn algorithm(self, algorithm: impl Into<Algorithm>) -> Case {
        Case { algorithm: Some(algorithm.into()), ..self }
    }

    /// Makes this case where the rank is, until the returned guard drops; applies an injected
    /// failure meant for it.
    pub fn enter(self) -> Entered {
        let fault = injected(&self);
        let frame = rank_case::enter(self);
        if fault == Some(Fault::Hang) {
            // The others wait in the operation this rank never starts.
            loop {
                std::thread::sleep(std::time::Duration::from_secs(3600));
            }
        }
        Entered { _frame: frame, wrong: fault == Some(Fault::Wrong) }
    }
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.op)?;
        if self.nb {
            write!(f, " non-blocking")?;
        }
        if self.in_place {
            write!(f, " in place")?;
        }
        write!(f, ", {}", self.elem)?;
        if let Some(o) = self.operator {
            write!(f, ", {o}")?;
        }
        write!(f, ", count {}", self.count)?;
        if let Some(r) = self.root {
            write!(f, ", root {r}")?;
        }
        if let Some(a) = &self.algorithm {
            write!(f, ", algorithm {a}")?;
        }
        Ok(())
    }
}

/// A case this rank is in.
pub struct Entered {
    _frame: rank_case::Frame,
    /// The injected `wrong`: the first check sees a corrupted expectation.
    wrong: bool,
}

impl Entered {
    /// The operation returned without an error.
    #[track_caller]
    pub fn ok(&self, r: Result<()>) {
        if let Err(e) = r {
            panic!("returned an error: {e}");
        }
    }

    /// `got` is bit for bit `expected`.
    #[track_caller]
    pub fn check<T: Element + fmt::Debug>(&self, got: &[T], expected: &[T]) {
        if self.wrong {
            let mut corrupted = expected.to_vec();
            match corrupted.first_mut() {
                Some(x) => duralumin::bytemuck::bytes_of_mut(x)[0] ^= 0xFF,
                None => corrupted.push(duralumin::bytemuck::Zeroable::zeroed()),
            }
            assert!(same(got, &corrupted), "got {got:?}, expected {corrupted:?}");
        }
        assert!(same(got, expected), "got {got:?}, expected {expected:?}");
    }

    /// The operation left its input as it was.
    #[track_caller]
    pub fn unchanged<T: Element + fmt::Debug>(&self, input: &[T], was: &[T]) {
        assert!(same(input, was), "the input changed: now {input:?}, was {was:?}");
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    Wrong,
    Hang,
}

/// A parsed `DURALUMIN_TEST_BREAK`.
struct Break {
    fault: Fault,
    rank: usize,
    fields: Vec<(String, String)>,
}

impl Break {
    fn parse(spec: &str) -> Break {
        let bad = || -> ! { panic!("{BREAK}={spec}: expected <wrong|hang>:rank=<r>,<field>=<value>,...") };
        let (how, rest) = spec.split_once(':').unwrap_or_else(|| bad());
        let fault = match how {
            "wrong" => Fault::Wrong,
            "hang" => Fault::Hang,
            _ => bad(),
        };
        let mut rank = None;
        let mut fields = Vec::new();
        for kv in rest.split(',') {
            let (k, v) = kv.split_once('=').unwrap_or_else(|| bad());
            match k.trim() {
                "rank" => rank = Some(v.trim().parse().unwrap_or_else(|_| bad())),
                k @ ("op" | "type" | "operator" | "count" | "root" | "algorithm" | "nb" | "in_place") => {
                    fields.push((k.to_string(), v.trim().to_string()))
                }
                other => panic!("{BREAK}: unknown field {other:?}"),
            }
        }
        Break { fault, rank: rank.unwrap_or_else(|| bad()), fields }
    }

    fn matches(&self, c: &Case) -> bool {
        self.fields.iter().all(|(k, v)| {
            let value = match k.as_str() {
                "op" => Some(c.op.to_string()),
                "type" => Some(c.elem.to_string()),
                "operator" => c.operator.map(str::to_string),
                "count" => Some(c.count.to_string()),
                "root" => c.root.map(|r| r.to_string()),
                "algorithm" => c.algorithm.map(|a| a.to_string()),
                "nb" => Some(c.nb.to_string()),
                "in_place" => Some(c.in_place.to_string()),
                _ => None,
            };
            value.is_some_and(|x| x.eq_ignore_ascii_case(v))
        })
    }
}

/// The injected failure for `case`, if it is the first case that the break matches here.
fn injected(case: &Case) -> Option<Fault> {
    static SPEC: OnceLock<Option<Break>> = OnceLock::new();
    static FIRED: AtomicBool = AtomicBool::new(false);
    let spec = || std::env::var(BREAK).ok().filter(|s| !s.is_empty()).map(|s| Break::parse(&s));
    let b = SPEC.get_or_init(spec).as_ref()?;
    if rank_case::rank() != Some(b.rank) || FIRED.load(Ordering::Relaxed) || !b.matches(case) {
        return None;
    }
    FIRED.store(true, Ordering::Relaxed);
    Some(b.fault)
}
