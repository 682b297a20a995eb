//! The SVG plot of a run: latency percentiles and decisions per second over the
//! measurement window, one line set per client (each point at the middle of its second;
//! a partial last second at the middle of its length, its rate over that length).
//!
//! Owns drawing only; takes finished results. Must not touch clients or sockets.

use std::path::Path;

use crate::output::{PhaseResult, SecondPoint};

/// SVG: latency percentiles (top) and throughput (bottom) over time, one line set per client.
pub fn write_svg(path: &Path, results: &[PhaseResult]) -> Result<(), String> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (1000, 800)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let (top, bottom) = root.split_vertically(420);
    let series: Vec<_> = results
        .iter()
        .map(|r| (r.client.name(), r.series()))
        .collect();
    let t_max = results.iter().map(|r| r.window_s).fold(1.0, f64::max);
    let lat_max = series
        .iter()
        .flat_map(|(_, s)| s.iter().map(|p| p.p99_us))
        .fold(1.0, f64::max)
        * 1.1;
    let thr_max = series
        .iter()
        .flat_map(|(_, s)| s.iter().map(SecondPoint::decisions_per_s))
        .fold(1.0, f64::max)
        * 1.1;
    let colors = [RED, BLUE, GREEN, MAGENTA, CYAN, BLACK];

    let mut c = ChartBuilder::on(&top)
        .caption("latency percentiles per second (µs)", ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..t_max, 0f64..lat_max)
        .map_err(|e| e.to_string())?;
    c.configure_mesh()
        .x_desc("s")
        .y_desc("µs")
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, (name, s)) in series.iter().enumerate() {
        let col = colors[i % colors.len()];
        for (label, p99, width) in [("p50", false, 1u32), ("p99", true, 2)] {
            let pts: Vec<(f64, f64)> = s
                .iter()
                .filter(|p| p.completions > 0)
                .map(|p| (mid(p), if p99 { p.p99_us } else { p.p50_us }))
                .collect();
            c.draw_series(LineSeries::new(pts, col.stroke_width(width)))
                .map_err(|e| e.to_string())?
                .label(format!("{name} {label}"))
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], col.stroke_width(width))
                });
        }
    }
    c.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())?;

    draw_throughput(&bottom, &series, t_max, thr_max, &colors)?;
    root.present().map_err(|e| e.to_string())
}

/// Where a point is drawn: the middle of its (possibly partial) second.
fn mid(p: &SecondPoint) -> f64 {
    p.t_s + p.length_s / 2.0
}

/// The lower chart of [`write_svg`]: decisions per second of every client.
fn draw_throughput<DB: plotters::prelude::DrawingBackend>(
    area: &plotters::prelude::DrawingArea<DB, plotters::coord::Shift>,
    series: &[(&str, Vec<SecondPoint>)],
    t_max: f64,
    thr_max: f64,
    colors: &[plotters::prelude::RGBColor],
) -> Result<(), String> {
    use plotters::prelude::*;
    let mut c = ChartBuilder::on(area)
        .caption("decisions per second", ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(80)
        .build_cartesian_2d(0f64..t_max, 0f64..thr_max)
        .map_err(|e| e.to_string())?;
    c.configure_mesh()
        .x_desc("s")
        .y_desc("decisions/s")
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, (name, s)) in series.iter().enumerate() {
        let col = colors[i % colors.len()];
        let pts: Vec<(f64, f64)> = s.iter().map(|p| (mid(p), p.decisions_per_s())).collect();
        c.draw_series(LineSeries::new(pts, col.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(name.to_string())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], col.stroke_width(2)));
    }
    c.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())?;
    Ok(())
}
