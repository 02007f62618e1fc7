//! `duralumin-perf`'s command line: nccl-tests' flags, and Duralumin's own.

use crate::ops::{Coll, Redop};

pub const USAGE: &str = "\
duralumin-perf: bus bandwidth of Duralumin's operations, after nccl-tests (run it under mpirun)

  -b, --minbytes SIZE     smallest size (default 8; K, M, G are powers of 1024)
  -e, --maxbytes SIZE     largest size (default 64M)
  -f, --stepfactor F      multiply the size by F between rows (default 2)
  -i, --stepbytes SIZE    add SIZE between rows instead
  -o, --op NAME[,NAME]    the operation: allreduce, reduce, bcast, allgather(v), reduce_scatter(v),
                          alltoall(v), gather(v), scatter(v), sendrecv, multi_sendrecv, send (send
                          and recv in rank pairs), barrier, or all; a reduction operator (sum, prod,
                          min, max, avg, as nccl-tests' -o) sets --redop instead
      --redop NAME[,NAME] the reduction operator: sum, prod, min, max, avg, or all (default sum)
  -d, --datatype NAME     int8, uint8, int32, uint32, int64, uint64, half, float, double, bfloat16
                          (default float)
  -r, --root N            the root of rooted operations (default 0)
  -n, --iters N           timed iterations per row (default 20)
  -w, --warmup_iters N    untimed iterations first (default 5)
  -c, --check 0|1         check every result, count wrong elements (default 1)
  -z, --blocking 0|1      1: every call completes before the next starts (a stream-ordered
                          backend's stream is synchronized after each); 0: calls are queued on
                          the stream, or on Mpi started non-blocking (its i-calls, up to 8 at
                          once, each on its own buffers, as MPI's own with --native), and
                          completed together (default: 0 on host-transfer and nccl, 1 on mpi)
      --backend LIST      mpi, host-transfer, nccl (comma-separated; default mpi)
      --device NAME       host (the CPU; the Mpi backend's only one) or cuda (default host)
      --algorithm LIST    allreduce and bcast algorithms: auto, native, ring, recursive_doubling,
                          rabenseifner, hierarchical, shared_memory, chain, or all (default auto)
      --native            time the MPI library's own operation too, as extra columns
      --csv FILE          the table as CSV
      --json FILE         the table as JSON: a list of rows keyed by column name
      --plot FILE.svg     bus bandwidth against size, one line per backend and algorithm
      --trace FILE.json   a Chrome trace of every operation (Perfetto opens it); rank r > 0
                          writes FILE with .rank<r> before the extension
      --nvtx              NVTX ranges for Nsight Systems (built with the nvtx feature)
      --span-cost         only time a 4 B allreduce on Mpi with the library's spans on and off
                          (no subscriber): what the spans cost per operation
  -h, --help              this text
";

/// What to run.
#[derive(Clone, Debug, PartialEq)]
pub struct Args {
    pub min_bytes: usize,
    pub max_bytes: usize,
    pub step_factor: f64,
    pub step_bytes: usize,
    pub colls: Vec<Coll>,
    pub redops: Vec<Redop>,
    pub dtype: String,
    pub root: usize,
    pub iters: usize,
    pub warmup: usize,
    pub check: bool,
    /// `-z`, if given (see [`Args::blocking_on`]).
    pub blocking: Option<bool>,
    pub backends: Vec<String>,
    pub device: String,
    pub algorithms: Vec<String>,
    pub native: bool,
    pub csv: Option<String>,
    pub json: Option<String>,
    pub plot: Option<String>,
    pub trace: Option<String>,
    pub nvtx: bool,
    pub span_cost: bool,
    pub help: bool,
}

impl Default for Args {
    fn default() -> Args {
        Args {
            min_bytes: 8,
            max_bytes: 64 << 20,
            step_factor: 2.0,
            step_bytes: 0,
            colls: vec![Coll::Allreduce],
            redops: vec![Redop::Sum],
            dtype: "float".into(),
            root: 0,
            iters: 20,
            warmup: 5,
            check: true,
            blocking: None,
            backends: vec!["mpi".into()],
            device: "host".into(),
            algorithms: vec!["auto".into()],
            native: false,
            csv: None,
            json: None,
            plot: None,
            trace: None,
            nvtx: false,
            span_cost: false,
            help: false,
        }
    }
}

/// A size such as `8`, `64K`, `256M` or `1G` (powers of 1024, as nccl-tests).
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let (num, shift) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 10),
        Some('M') => (&t[..t.len() - 1], 20),
        Some('G') => (&t[..t.len() - 1], 30),
        _ => (t, 0),
    };
    let n: usize = num.parse().map_err(|_| format!("not a size: '{s}'"))?;
    n.checked_mul(1usize << shift).ok_or_else(|| format!("size too large: '{s}'"))
}

fn list(v: &str) -> impl Iterator<Item = &str> {
    v.split(',').map(str::trim).filter(|s| !s.is_empty())
}

fn flag01(v: &str) -> Result<bool, String> {
    match v {
        "0" => Ok(false),
        "1" => Ok(true),
        _ => Err(format!("expected 0 or 1, got '{v}'")),
    }
}

impl Args {
    /// Parses the flags (without the program name).
    pub fn parse(argv: &[String]) -> Result<Args, String> {
        let mut a = Args::default();
        let mut it = argv.iter();
        while let Some(flag) = it.next() {
            let (name, inline) = match flag.split_once('=') {
                Some((n, v)) if n.starts_with("--") => (n, Some(v.to_string())),
                _ => (flag.as_str(), None),
            };
            let boolean = matches!(name, "--native" | "--nvtx" | "--span-cost" | "-h" | "--help");
            let value = if boolean {
                String::new()
            } else {
                inline.or_else(|| it.next().cloned()).ok_or_else(|| format!("{name} takes a value"))?
            };
            let num = |v: &str| v.parse::<usize>().map_err(|_| format!("{name}: not a number: '{v}'"));
            match name {
                "-b" | "--minbytes" => a.min_bytes = parse_size(&value)?,
                "-e" | "--maxbytes" => a.max_bytes = parse_size(&value)?,
                "-f" | "--stepfactor" => {
                    a.step_factor = value.parse().map_err(|_| format!("{name}: not a number: '{value}'"))?;
                }
                "-i" | "--stepbytes" => a.step_bytes = parse_size(&value)?,
                "-o" | "--op" => a.set_ops(&value)?,
                "--redop" => a.redops = parse_redops(&value)?,
                "-d" | "--datatype" => a.dtype = value,
                "-r" | "--root" => a.root = num(&value)?,
                "-n" | "--iters" => a.iters = num(&value)?.max(1),
                "-w" | "--warmup_iters" => a.warmup = num(&value)?,
                "-c" | "--check" => a.check = flag01(&value)?,
                "-z" | "--blocking" => a.blocking = Some(flag01(&value)?),
                "--backend" => a.backends = list(&value).map(|b| b.replace('_', "-")).collect(),
                "--device" => a.device = value,
                "--algorithm" => a.algorithms = list(&value).map(str::to_string).collect(),
                "--native" => a.native = true,
                "--csv" => a.csv = Some(value),
                "--json" => a.json = Some(value),
                "--plot" => a.plot = Some(value),
                "--trace" => a.trace = Some(value),
                "--nvtx" => a.nvtx = true,
                "--span-cost" => a.span_cost = true,
                "-h" | "--help" => a.help = true,
                other => return Err(format!("unknown flag '{other}' (see --help)")),
            }
        }
        a.validate()?;
        Ok(a)
    }

    /// Whether calls complete one by one (`-z 1`) on a backend whose calls are queued on a
    /// stream (`stream_ordered`) or not: by default, each backend's own way (queued on a stream;
    /// the Mpi backend's blocking calls).
    pub fn blocking_on(&self, stream_ordered: bool) -> bool {
        self.blocking.unwrap_or(!stream_ordered)
    }

    fn set_ops(&mut self, v: &str) -> Result<(), String> {
        if v == "all" {
            self.colls = Coll::ALL.to_vec();
            return Ok(());
        }
        if list(v).all(|x| Redop::parse(x).is_some()) {
            self.redops = parse_redops(v)?;
            return Ok(());
        }
        self.colls = list(v)
            .map(|x| Coll::parse(x).ok_or_else(|| format!("-o: unknown operation '{x}'")))
            .collect::<Result<_, _>>()?;
        Ok(())
    }

    fn validate(&self) -> Result<(), String> {
        if self.min_bytes > self.max_bytes {
            return Err(format!("-b {} is above -e {}", self.min_bytes, self.max_bytes));
        }
        if self.step_bytes == 0 && self.step_factor <= 1.0 {
            return Err("-f must be above 1 (or give -i)".into());
        }
        for b in &self.backends {
            if !matches!(b.as_str(), "mpi" | "host-transfer" | "nccl") {
                return Err(format!("--backend: unknown backend '{b}' (mpi, host-transfer, nccl)"));
            }
        }
        if self.span_cost && (self.trace.is_some() || self.nvtx) {
            return Err("--span-cost times the spans with no subscriber: leave out --trace and --nvtx".into());
        }
        if !matches!(self.device.as_str(), "host" | "cuda") {
            return Err(format!("--device: unknown device '{}' (host, cuda)", self.device));
        }
        Ok(())
    }

    /// The row sizes, smallest first.
    pub fn sizes(&self) -> Vec<usize> {
        let mut out = Vec::new();
        let mut s = self.min_bytes;
        while s <= self.max_bytes {
            out.push(s);
            let next = if self.step_bytes > 0 {
                s.saturating_add(self.step_bytes)
            } else {
                #[allow(
                    clippy::cast_possible_truncation,
                    clippy::cast_sign_loss,
                    reason = "a size, finite and positive"
                )]
                let m = (s as f64 * self.step_factor) as usize;
                m.max(s + 1)
            };
            if next == s {
                break;
            }
            s = next;
        }
        out
    }
}

fn parse_redops(v: &str) -> Result<Vec<Redop>, String> {
    if v == "all" {
        return Ok(Redop::ALL.to_vec());
    }
    list(v).map(|x| Redop::parse(x).ok_or_else(|| format!("unknown reduction operator '{x}'"))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Args, String> {
        Args::parse(&s.split_whitespace().map(String::from).collect::<Vec<_>>())
    }

    #[test]
    fn nccl_tests_flags_parse() {
        let a = parse("-b 8 -e 128M -f 2 -o all_reduce -d half -n 5 -w 1 -c 0 -z 1 --native").unwrap();
        assert_eq!((a.min_bytes, a.max_bytes, a.iters, a.warmup), (8, 128 << 20, 5, 1));
        assert_eq!(a.colls, vec![Coll::Allreduce]);
        assert!(!a.check && a.blocking == Some(true) && a.native);
        assert!(a.blocking_on(true) && a.blocking_on(false));
        let d = Args::default();
        assert!(!d.blocking_on(true) && d.blocking_on(false), "each backend's own completion by default");
        assert_eq!(a.sizes().len(), 25);
        // nccl-tests' -o is the reduction operator.
        assert_eq!(parse("-o prod").unwrap().redops, vec![Redop::Prod]);
        assert_eq!(parse("-o all").unwrap().colls.len(), Coll::ALL.len());
        assert_eq!(parse("-b 1K -e 4K -i 1K").unwrap().sizes(), vec![1024, 2048, 3072, 4096]);
        assert_eq!(parse("--json=x.json").unwrap().json.as_deref(), Some("x.json"));
    }

    #[test]
    fn bad_flags_are_refused_with_a_reason() {
        assert!(parse("-b 1M -e 1K").unwrap_err().contains("above"));
        assert!(parse("-o nonsense").unwrap_err().contains("unknown operation"));
        assert!(parse("--backend gloo").unwrap_err().contains("unknown backend"));
        assert!(parse("-c 2").unwrap_err().contains("0 or 1"));
        assert!(parse("-n").unwrap_err().contains("takes a value"));
        assert!(parse_size("12Q").is_err());
    }
}
