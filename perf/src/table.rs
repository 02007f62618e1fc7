//! The rows `duralumin-perf` measures and their three forms: the nccl-tests-like table on
//! stdout, CSV and JSON (a list of rows whose keys are the column names).

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

/// One timed form of an operation (out-of-place or in-place): nccl-tests' column group.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    /// Average time of one operation, µs (the slowest rank's).
    pub time: f64,
    /// Algorithm bandwidth, GB/s: size / time.
    pub algbw: f64,
    /// Bus bandwidth, GB/s: algbw × the operation's factor.
    pub busbw: f64,
    /// Wrong elements over all ranks (`None`: not checked).
    pub wrong: Option<u64>,
    /// Host time of one call on the calling thread, µs (stream-ordered backends: enqueue).
    pub enqueue: Option<f64>,
}

impl Timing {
    /// A timing of `time_us` for a row of `bytes` whose bus factor is `factor`.
    pub fn new(bytes: usize, time_us: f64, factor: f64) -> Timing {
        let algbw = if time_us > 0.0 { bytes as f64 / (time_us * 1e3) } else { 0.0 };
        Timing { time: time_us, algbw, busbw: algbw * factor, wrong: None, enqueue: None }
    }
}

/// One row: an operation at one size on one backend and algorithm.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Row {
    pub op: String,
    pub backend: String,
    pub device: String,
    pub algorithm: String,
    pub np: usize,
    /// Bytes: the largest buffer of the operation (nccl-tests' convention).
    pub size: usize,
    pub count: usize,
    #[serde(rename = "type")]
    pub elem: String,
    /// The reduction operator, or `none`.
    pub redop: String,
    /// The root, or -1 where the operation has none.
    pub root: i64,
    pub out_of_place: Timing,
    pub in_place: Option<Timing>,
    /// The MPI library's own operation on host buffers of the same size (`--native`).
    pub native: Option<Timing>,
}

/// Formats a float column of `width`, or `-` for none.
fn col(v: Option<f64>, width: usize, prec: usize) -> String {
    match v {
        Some(v) => format!("{v:>width$.prec$}"),
        None => format!("{:>width$}", "-"),
    }
}

fn wrong_col(w: Option<u64>) -> String {
    w.map_or_else(|| format!("{:>6}", "N/A"), |w| format!("{w:>6}"))
}

/// The header lines of the table (with an enqueue column for stream-ordered backends and native
/// columns with `--native`).
pub fn header(enqueue: bool, native: bool) -> String {
    let mut top = format!("#{:>15} {:>18} {:>11} {:>12} {:>8} {:>6} {:>6}", "", "", "", "", "", "", "");
    let mut names = format!(
        "#{:>15} {:>18} {:>11} {:>12} {:>8} {:>6} {:>6}",
        "op", "algorithm", "size", "count", "type", "redop", "root"
    );
    let mut units = format!("#{:>15} {:>18} {:>11} {:>12} {:>8} {:>6} {:>6}", "", "", "(B)", "(elements)", "", "", "");
    let group = |top: &mut String, names: &mut String, units: &mut String, title: &str, wrong: bool| {
        let w = if wrong { 7 } else { 0 };
        let _ = write!(top, "  {:^width$}", title, width = 28 + w + if enqueue { 9 } else { 0 });
        let _ = write!(names, "  {:>8} {:>9} {:>9}", "time", "algbw", "busbw");
        let _ = write!(units, "  {:>8} {:>9} {:>9}", "(us)", "(GB/s)", "(GB/s)");
        if wrong {
            let _ = write!(names, " {:>6}", "#wrong");
            let _ = write!(units, " {:>6}", "");
        }
        if enqueue {
            let _ = write!(names, " {:>8}", "enqueue");
            let _ = write!(units, " {:>8}", "(us)");
        }
    };
    group(&mut top, &mut names, &mut units, "out-of-place", true);
    group(&mut top, &mut names, &mut units, "in-place", true);
    if native {
        let _ = write!(top, "  {:^28}", "native MPI");
        let _ = write!(names, "  {:>8} {:>9} {:>9}", "time", "algbw", "busbw");
        let _ = write!(units, "  {:>8} {:>9} {:>9}", "(us)", "(GB/s)", "(GB/s)");
    }
    format!("{top}\n{names}\n{units}")
}

/// One line of the table.
pub fn line(row: &Row, enqueue: bool, native: bool) -> String {
    let mut s = format!(
        " {:>15} {:>18} {:>11} {:>12} {:>8} {:>6} {:>6}",
        row.op,
        row.algorithm,
        row.size,
        row.count,
        row.elem,
        row.redop,
        if row.root < 0 { "-".to_string() } else { row.root.to_string() }
    );
    let group = |s: &mut String, t: Option<&Timing>| {
        let _ = write!(
            s,
            "  {} {} {} {}",
            col(t.map(|t| t.time), 8, 2),
            col(t.map(|t| t.algbw), 9, 3),
            col(t.map(|t| t.busbw), 9, 3),
            wrong_col(t.and_then(|t| t.wrong))
        );
        if enqueue {
            let _ = write!(s, " {}", col(t.and_then(|t| t.enqueue), 8, 2));
        }
    };
    group(&mut s, Some(&row.out_of_place));
    group(&mut s, row.in_place.as_ref());
    if native {
        let t = row.native.as_ref();
        let _ = write!(
            s,
            "  {} {} {}",
            col(t.map(|t| t.time), 8, 2),
            col(t.map(|t| t.algbw), 9, 3),
            col(t.map(|t| t.busbw), 9, 3)
        );
    }
    s
}

/// Every timed form of `rows`: out of place, and in place where there is one.
fn timings(rows: &[Row]) -> impl Iterator<Item = Timing> + '_ {
    rows.iter().flat_map(|r| [Some(r.out_of_place), r.in_place]).flatten()
}

/// nccl-tests' closing lines: the wrong-element total and the average bus bandwidth over the
/// rows (out-of-place and in-place together, as nccl-tests averages both).
pub fn summary(rows: &[Row]) -> String {
    let wrong = wrong_total(rows);
    let bw: Vec<f64> = timings(rows).map(|t| t.busbw).collect();
    let avg = if bw.is_empty() { 0.0 } else { bw.iter().sum::<f64>() / bw.len() as f64 };
    format!(
        "# Out of bounds values : {wrong} {}\n# Avg bus bandwidth    : {avg:.4} \n#",
        if wrong == 0 { "OK" } else { "FAILED" }
    )
}

/// The total of wrong elements over `rows`.
pub fn wrong_total(rows: &[Row]) -> u64 {
    timings(rows).filter_map(|t| t.wrong).sum()
}

/// The rows as CSV, one line per row and the same columns as the table.
pub fn csv(rows: &[Row]) -> String {
    let mut s = String::from(
        "op,backend,device,algorithm,np,size,count,type,redop,root,time,algbw,busbw,wrong,enqueue,\
         ip_time,ip_algbw,ip_busbw,ip_wrong,ip_enqueue,native_time,native_algbw,native_busbw\n",
    );
    let f = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.4}"));
    let timing = |t: Option<&Timing>, with_wrong: bool| {
        let mut parts = vec![f(t.map(|t| t.time)), f(t.map(|t| t.algbw)), f(t.map(|t| t.busbw))];
        if with_wrong {
            parts.push(t.and_then(|t| t.wrong).map_or(String::new(), |w| w.to_string()));
            parts.push(f(t.and_then(|t| t.enqueue)));
        }
        parts.join(",")
    };
    for r in rows {
        let _ = writeln!(
            s,
            "{},{},{},{},{},{},{},{},{},{},{},{},{}",
            r.op,
            r.backend,
            r.device,
            r.algorithm,
            r.np,
            r.size,
            r.count,
            r.elem,
            r.redop,
            r.root,
            timing(Some(&r.out_of_place), true),
            timing(r.in_place.as_ref(), true),
            timing(r.native.as_ref(), false)
        );
    }
    s
}

/// The rows as JSON: a list of objects whose keys are the column names (`size`, `count`,
/// `type`, `redop`, `root`, `time`, `algbw`, `busbw`, `wrong`, `enqueue`, the in-place ones
/// prefixed `ip_`, the native ones `native_`), plus `op`, `backend`, `device`, `algorithm`, `np`.
pub fn json(rows: &[Row]) -> serde_json::Value {
    let flat = |r: &Row| {
        let mut m = serde_json::Map::new();
        for (k, v) in [
            ("op", serde_json::json!(r.op)),
            ("backend", serde_json::json!(r.backend)),
            ("device", serde_json::json!(r.device)),
            ("algorithm", serde_json::json!(r.algorithm)),
            ("np", serde_json::json!(r.np)),
            ("size", serde_json::json!(r.size)),
            ("count", serde_json::json!(r.count)),
            ("type", serde_json::json!(r.elem)),
            ("redop", serde_json::json!(r.redop)),
            ("root", serde_json::json!(r.root)),
        ] {
            m.insert(k.into(), v);
        }
        for (prefix, t) in [("", Some(&r.out_of_place)), ("ip_", r.in_place.as_ref()), ("native_", r.native.as_ref())] {
            let Some(t) = t else { continue };
            m.insert(format!("{prefix}time"), serde_json::json!(t.time));
            m.insert(format!("{prefix}algbw"), serde_json::json!(t.algbw));
            m.insert(format!("{prefix}busbw"), serde_json::json!(t.busbw));
            if prefix != "native_" {
                m.insert(format!("{prefix}wrong"), serde_json::json!(t.wrong));
                m.insert(format!("{prefix}enqueue"), serde_json::json!(t.enqueue));
            }
        }
        serde_json::Value::Object(m)
    };
    serde_json::Value::Array(rows.iter().map(flat).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(wrong: u64) -> Row {
        let mut t = Timing::new(1 << 20, 100.0, 1.5);
        t.wrong = Some(wrong);
        Row {
            op: "allreduce".into(),
            backend: "mpi".into(),
            device: "host".into(),
            algorithm: "auto".into(),
            np: 4,
            size: 1 << 20,
            count: 1 << 18,
            elem: "float".into(),
            redop: "sum".into(),
            root: -1,
            out_of_place: t,
            in_place: Some(t),
            native: Some(Timing::new(1 << 20, 200.0, 1.5)),
        }
    }

    #[test]
    fn bandwidths_follow_the_size_and_time() {
        let t = Timing::new(1_000_000, 100.0, 1.5);
        assert!((t.algbw - 10.0).abs() < 1e-9 && (t.busbw - 15.0).abs() < 1e-9);
    }

    #[test]
    fn json_rows_carry_the_column_names_and_csv_one_line_per_row() {
        let rows = [row(0), row(3)];
        let j = json(&rows);
        let first = &j[0];
        assert_eq!(first["size"], 1 << 20);
        assert_eq!(first["wrong"], 0);
        assert_eq!(j[1]["ip_wrong"], 3);
        assert!((first["busbw"].as_f64().unwrap() - 15.728_64).abs() < 1e-6);
        assert!(first["native_busbw"].is_number() && first.get("native_wrong").is_none());
        assert_eq!(csv(&rows).lines().count(), 3);
        assert_eq!(wrong_total(&rows), 6);
        assert!(summary(&rows).contains("FAILED"));
        assert_eq!(header(true, true).lines().count(), 3);
        assert!(line(&rows[0], true, true).contains("15.729"));
    }
}
