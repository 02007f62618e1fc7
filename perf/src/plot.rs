//! Bus bandwidth against size, one line per series, as an SVG file (`plotters`' SVG backend:
//! no system library). `duralumin-perf --plot` and the topology and collectives benches draw
//! with it.

use std::path::Path;

use plotters::prelude::*;

use crate::table::Row;

/// One line of a plot: its label and `(bytes, GB/s)` points.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub label: String,
    pub points: Vec<(usize, f64)>,
}

/// The series of `rows`: one per operation (where there are several), backend and algorithm,
/// out-of-place bus bandwidth, and one per operation for the native MPI columns.
pub fn series_of(rows: &[Row]) -> Vec<Series> {
    let several_ops = rows.iter().any(|r| r.op != rows[0].op);
    let op = |r: &Row| if several_ops { format!("{} ", r.op) } else { String::new() };
    let mut out: Vec<Series> = Vec::new();
    for r in rows {
        let device = if r.device == "host" { String::new() } else { format!("<{}>", r.device) };
        push_to(&mut out, format!("{}{}{device} {}", op(r), r.backend, r.algorithm), r.size, r.out_of_place.busbw);
    }
    // MPI's own operation is measured again beside every backend and algorithm: one line per
    // operation, from its first measurement at each size.
    for r in rows {
        let Some(n) = r.native else { continue };
        let label = format!("{}native MPI", op(r));
        if !out.iter().any(|s| s.label == label && s.points.iter().any(|p| p.0 == r.size)) {
            push_to(&mut out, label, r.size, n.busbw);
        }
    }
    out
}

/// Adds `(size, bw)` to the series `label` of `out` (a new one if there is none).
pub fn push_to(out: &mut Vec<Series>, label: String, size: usize, bw: f64) {
    match out.iter_mut().find(|s| s.label == label) {
        Some(s) => s.points.push((size, bw)),
        None => out.push(Series { label, points: vec![(size, bw)] }),
    }
}

/// Human units for a byte count on the axis.
fn bytes_label(b: f64) -> String {
    match b {
        b if b >= (1u64 << 30) as f64 => format!("{:.0}G", b / (1u64 << 30) as f64),
        b if b >= (1u64 << 20) as f64 => format!("{:.0}M", b / (1u64 << 20) as f64),
        b if b >= 1024.0 => format!("{:.0}K", b / 1024.0),
        b => format!("{b:.0}"),
    }
}

/// Draws `series` into the SVG file `path` under `title`.
pub fn plot(path: &Path, title: &str, series: &[Series]) -> Result<(), String> {
    let pts = || series.iter().flat_map(|s| s.points.iter());
    let (lo, hi) = pts().fold((usize::MAX, 1usize), |(lo, hi), &(x, _)| (lo.min(x.max(1)), hi.max(x)));
    if lo > hi {
        return Err("nothing to plot: no rows".into());
    }
    // The size axis in powers of two (log2 of the size, labelled as sizes), as nccl-tests steps.
    let (lo2, hi2) = (lo.ilog2(), hi.max(2).ilog2().max(lo.ilog2() + 1));
    let (lo, hi) = (f64::from(lo2), f64::from(hi2));
    let log2 = |x: usize| (x.max(1) as f64).log2();
    let top = pts().map(|&(_, y)| y).fold(0.0f64, f64::max).max(1e-3) * 1.1;
    let root = SVGBackend::new(path, (960, 600)).into_drawing_area();
    let err = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(lo..hi + 0.05, 0.0..top)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("size (bytes)")
        .y_desc("bus bandwidth (GB/s)")
        .x_labels(usize::try_from(hi2 - lo2 + 1).unwrap_or(16).min(16))
        .x_label_formatter(&|x| if x.fract().abs() < 1e-9 { bytes_label(x.exp2()) } else { String::new() })
        .draw()
        .map_err(|e| err(&e))?;
    for (i, s) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let line = s.points.iter().map(|&(x, y)| (log2(x), y));
        chart
            .draw_series(LineSeries::new(line.clone(), color.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(s.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
        chart.draw_series(line.map(|p| Circle::new(p, 3, color.filled()))).map_err(|e| err(&e))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_svg_with_every_series_label_is_written() {
        let dir = std::env::temp_dir().join(format!("duralumin-perf-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("p.svg");
        let series = vec![
            Series { label: "mpi auto".into(), points: vec![(8, 0.01), (1 << 20, 3.0), (64 << 20, 5.5)] },
            Series { label: "native MPI".into(), points: vec![(8, 0.02), (1 << 20, 2.0), (64 << 20, 2.5)] },
        ];
        plot(&path, "allreduce, 2 ranks", &series).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("mpi auto") && svg.contains("native MPI"));
        assert!(plot(&path, "none", &[]).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
