//! Charts where a picture reads better than a table, drawn with `plotters` into SVG (text is left to the viewer's
//! fonts, so no font files are needed). Each workload gets, from whatever its results hold:
//!
//! - **latency percentiles** of every histogram, one line per transport (rounds merged), one chart per case: the
//!   x axis is HdrHistogram's plotter's, `1/(1-p)` on a log scale, labelled with the percentile (90%, 99%, 99.9%),
//!   so the tail gets as much room as the body; the y axis is linear, or logarithmic when the transports' tails are
//!   more than 20 times apart;
//! - a **sweep** (first-contact's RTTs, handshake-rate's workers, idle-links' link counts): the primary metric per
//!   swept value, one line per transport, median of rounds with min-max bars;
//! - otherwise the **primary metric per case** (fanout's and flood's delivered/s, drain's orders/s) as grouped
//!   bars, median with min-max;
//! - the **restart timeline**: orders stored per 100 ms bin in each transport's first round, the kill marked.
//!
//! A chart without data is not drawn. A transport with runs whose numbers cannot be trusted
//! ([`crate::check::distrust`]) is drawn dashed (lines) or pale (bars), its legend saying so.

use anyhow::Result;
use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;
use workloads::result::RunResult;
use workloads::workload::Info;

const SIZE: (u32, u32) = (760, 360);
const FONT: &str = "sans-serif";
/// Tableau 10: distinct, colour-blind friendly enough, readable on white.
const COLOURS: [RGBColor; 10] = [
    RGBColor(0x4e, 0x79, 0xa7),
    RGBColor(0xf2, 0x8e, 0x2b),
    RGBColor(0xe1, 0x57, 0x59),
    RGBColor(0x76, 0xb7, 0xb2),
    RGBColor(0x59, 0xa1, 0x4f),
    RGBColor(0xed, 0xc9, 0x48),
    RGBColor(0xb0, 0x7a, 0xa1),
    RGBColor(0xff, 0x9d, 0xa7),
    RGBColor(0x9c, 0x75, 0x5f),
    RGBColor(0xba, 0xb0, 0xac),
];

/// A point with its spread: x, the median of rounds, their min and max.
type Spread = (f64, f64, f64, f64);

/// A transport's line: its points and how many samples they summarise.
type Line = (String, Vec<(f64, f64)>, u64);

/// One chart.
#[derive(Debug, Clone)]
pub struct Chart {
    /// A name unique within a report, usable as a file stem (`restart-timeline`, `first-contact-sweep`).
    pub name: String,
    /// One line on what it shows.
    pub caption: String,
    /// The SVG document.
    pub svg: String,
}

/// A colour per transport, the same in every chart of a report.
#[derive(Debug, Clone, Default)]
pub struct Palette(Vec<String>);

impl Palette {
    /// The transports in the order they first appear.
    pub fn new(results: &[RunResult]) -> Palette {
        let mut order: Vec<String> = Vec::new();
        for r in results {
            let who = who(r);
            if !order.contains(&who) {
                order.push(who);
            }
        }
        Palette(order)
    }

    fn colour(&self, transport: &str) -> RGBColor {
        let i = self.0.iter().position(|t| t == transport).unwrap_or(0);
        COLOURS[i % COLOURS.len()]
    }
}

/// Every chart of every workload, in the order workloads first appear.
pub fn all(results: &[RunResult]) -> Result<Vec<Chart>> {
    let palette = Palette::new(results);
    let mut order: Vec<&str> = Vec::new();
    for r in results {
        if !order.contains(&r.workload.as_str()) {
            order.push(&r.workload);
        }
    }
    let mut out = Vec::new();
    for w in order {
        let rows: Vec<&RunResult> = results.iter().filter(|r| r.workload == w).collect();
        out.extend(for_workload(w, &rows, &palette)?);
    }
    Ok(out)
}

/// The charts of one workload's results.
pub fn for_workload(
    workload: &str,
    results: &[&RunResult],
    palette: &Palette,
) -> Result<Vec<Chart>> {
    let runs: Vec<&RunResult> = results
        .iter()
        .copied()
        .filter(|r| r.skipped.is_none())
        .collect();
    let mut doubtful: Vec<String> = Vec::new();
    for r in &runs {
        if !doubtful.contains(&who(r)) && !crate::check::distrust(r).is_empty() {
            doubtful.push(who(r));
        }
    }
    let look = Look { palette, doubtful };
    let info = workloads::by_name(workload).map(|w| w.info());
    let mut out = Vec::new();
    out.extend(timeline(workload, &runs, &look)?);
    if let Some(info) = info {
        match &info.sweep {
            Some(_) => out.extend(sweep(info, &runs, &look)?),
            None => out.extend(cases(info, &runs, &look)?),
        }
    }
    out.extend(percentiles(workload, info, &runs, &look)?);
    Ok(out)
}

/// How a transport's series is drawn: its colour, dashed or pale when some of its runs are not to be trusted.
struct Look<'a> {
    palette: &'a Palette,
    doubtful: Vec<String>,
}

impl Look<'_> {
    fn colour(&self, transport: &str) -> RGBColor {
        self.palette.colour(transport)
    }

    fn doubtful(&self, transport: &str) -> bool {
        self.doubtful.iter().any(|d| d == transport)
    }

    fn label(&self, transport: &str) -> String {
        if self.doubtful(transport) {
            format!("{transport} (not to be trusted)")
        } else {
            transport.to_string()
        }
    }

    /// A transport's line, solid, or dashed when it is not to be trusted; with its legend entry.
    fn line<X, Y>(
        &self,
        chart: &mut ChartContext<'_, SVGBackend<'_>, Cartesian2d<X, Y>>,
        points: Vec<(f64, f64)>,
        transport: &str,
        width: u32,
    ) -> Result<()>
    where
        X: Ranged<ValueType = f64>,
        Y: Ranged<ValueType = f64>,
    {
        let colour = self.colour(transport);
        let style = colour.stroke_width(width);
        let anno = if self.doubtful(transport) {
            chart.draw_series(DashedLineSeries::new(points, 5, 4, style))?
        } else {
            chart.draw_series(LineSeries::new(points, style))?
        };
        anno.label(self.label(transport)).legend(legend(colour));
        Ok(())
    }
}

/// How far above the highest value the y axis reaches: room for the legend in the upper right, a line per series.
fn headroom(series: usize) -> f64 {
    1.15 + 0.07 * series as f64
}

/// An axis number: thousands separated from 1,000 on, else without a float's trailing zeros.
fn axis(v: &f64) -> String {
    if v.abs() >= 1000.0 {
        crate::report::thousands(*v)
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// The series a run belongs to: its transport, marked when the run had an adversary beside it.
fn who(r: &RunResult) -> String {
    crate::hostile::label(r)
}

/// Series in the order they first appear among `runs`.
fn transports(runs: &[&RunResult]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for r in runs {
        let who = who(r);
        if !out.contains(&who) {
            out.push(who);
        }
    }
    out
}

/// The case label of a run (its workload's case keys and values), empty for a single-case workload.
fn case_of(info: Option<&Info>, r: &RunResult) -> String {
    info.map_or(&[][..], |i| i.case_keys)
        .iter()
        .filter_map(|k| r.params.get(*k).map(|v| format!("{k}={v}")))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A file-stem-safe form of a label.
fn slug(text: &str) -> String {
    let mut s: String = text
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    while s.contains("--") {
        s = s.replace("--", "-");
    }
    s.trim_matches('-').to_string()
}

/// Median, min and max of values (None when empty).
fn summary(values: &[f64]) -> Option<(f64, f64, f64)> {
    let med = crate::report::median(values)?;
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Some((med, min, max))
}

/// A series' legend entry: a short line in its colour.
fn legend(colour: RGBColor) -> impl Fn((i32, i32)) -> PathElement<(i32, i32)> {
    move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], colour.stroke_width(3))
}

/// The restart timeline: orders stored per 100 ms bin in each transport's first round, the kill dashed.
fn timeline(workload: &str, runs: &[&RunResult], look: &Look) -> Result<Option<Chart>> {
    let mut series: Vec<(String, Vec<f64>, f64)> = Vec::new();
    for r in runs {
        if series.iter().any(|(t, ..)| *t == who(r)) {
            continue;
        }
        let Some(bins) = r.metrics.get("timeline").and_then(|v| v.as_array()) else {
            continue;
        };
        // A run that failed before its kill has no kill bin: it has nothing to show here.
        let Some(kill) = r.metric("kill_bin") else {
            continue;
        };
        let bins: Vec<f64> = bins.iter().filter_map(|v| v.as_f64()).collect();
        if !bins.is_empty() {
            series.push((who(r), bins, kill));
        }
    }
    if series.is_empty() {
        return Ok(None);
    }
    let seconds = series.iter().map(|(_, b, _)| b.len()).max().unwrap_or(1) as f64 / 10.0;
    let top = series
        .iter()
        .flat_map(|(_, b, _)| b.iter().copied())
        .fold(1.0, f64::max)
        * 1.15;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(format!("{workload}: orders stored per 100 ms"), (FONT, 16))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(56)
            .build_cartesian_2d(0.0..seconds, 0.0..top)?;
        chart
            .configure_mesh()
            .x_desc("seconds from the start")
            .y_desc("orders per 100 ms")
            .y_label_formatter(&axis)
            .light_line_style(WHITE.mix(0.0))
            .draw()?;
        for (transport, bins, _) in &series {
            let points: Vec<(f64, f64)> = bins
                .iter()
                .enumerate()
                .map(|(i, v)| (i as f64 / 10.0, *v))
                .collect();
            look.line(&mut chart, points, transport, 1)?;
        }
        // The kill, once per distinct time (the transports of one invocation share it).
        let mut kills: Vec<f64> = series.iter().map(|(_, _, k)| k / 10.0).collect();
        kills.sort_by(f64::total_cmp);
        kills.dedup();
        for k in kills {
            chart.draw_series(DashedLineSeries::new(
                vec![(k, 0.0), (k, top / 1.15)],
                6,
                4,
                BLACK.mix(0.6).stroke_width(1),
            ))?;
            chart.draw_series(std::iter::once(Text::new(
                "kill",
                (k, top / 1.1),
                (FONT, 12).into_font().color(&BLACK),
            )))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .border_style(BLACK.mix(0.3))
            .background_style(WHITE.mix(0.9))
            .label_font((FONT, 12))
            .draw()?;
        root.present()?;
    }
    Ok(Some(Chart {
        name: format!("{}-timeline", slug(workload)),
        caption: format!(
            "{workload}: orders stored per 100 ms bin in each transport's first round; dashed: the kill (SIGKILL)"
        ),
        svg,
    }))
}

/// The primary metric against a swept parameter, one line per transport, median with min-max bars.
fn sweep(info: &Info, runs: &[&RunResult], look: &Look) -> Result<Option<Chart>> {
    let Some(sweep) = &info.sweep else {
        return Ok(None);
    };
    let (metric, _) = info.primary;
    let mut series: Vec<(String, Vec<Spread>)> = Vec::new();
    for t in transports(runs) {
        let mut xs: Vec<f64> = runs
            .iter()
            .filter(|r| who(r) == t)
            .filter_map(|r| r.params.get(sweep.key).and_then(|v| v.as_f64()))
            .collect();
        xs.sort_by(f64::total_cmp);
        xs.dedup();
        let points: Vec<Spread> = xs
            .into_iter()
            .filter_map(|x| {
                let values: Vec<f64> = runs
                    .iter()
                    .filter(|r| who(r) == t)
                    .filter(|r| r.params.get(sweep.key).and_then(|v| v.as_f64()) == Some(x))
                    .filter_map(|r| r.metric(metric))
                    .collect();
                summary(&values).map(|(m, lo, hi)| (x, m, lo, hi))
            })
            .collect();
        if !points.is_empty() {
            series.push((t, points));
        }
    }
    if series.is_empty() {
        return Ok(None);
    }
    let all = || series.iter().flat_map(|(_, p)| p.iter());
    let (x0, x1) = all().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| {
        (a.min(p.0), b.max(p.0))
    });
    let pad = ((x1 - x0) * 0.08).max(x0.abs() * 0.1).max(1.0);
    let top = all()
        .map(|p| p.3)
        .fold(0.0, f64::max)
        .max(f64::MIN_POSITIVE)
        * headroom(series.len());
    let unit = info
        .metrics
        .iter()
        .find(|m| m.key == metric)
        .map_or("", |m| m.unit);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                format!("{}: {metric} per {}", info.name, sweep.header),
                (FONT, 16),
            )
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(64)
            .build_cartesian_2d((x0 - pad)..(x1 + pad), 0.0..top)?;
        chart
            .configure_mesh()
            .x_desc(sweep.header)
            .y_desc(format!("{metric} ({unit})"))
            .x_label_formatter(&axis)
            .y_label_formatter(&axis)
            .light_line_style(WHITE.mix(0.0))
            .draw()?;
        for (t, points) in &series {
            let colour = look.colour(t);
            look.line(
                &mut chart,
                points.iter().map(|p| (p.0, p.1)).collect(),
                t,
                2,
            )?;
            chart.draw_series(
                points
                    .iter()
                    .map(|p| Circle::new((p.0, p.1), 3, colour.filled())),
            )?;
            chart.draw_series(
                points
                    .iter()
                    .map(|p| ErrorBar::new_vertical(p.0, p.2, p.1, p.3, colour.stroke_width(1), 8)),
            )?;
        }
        chart
            .configure_series_labels()
            .border_style(BLACK.mix(0.3))
            .background_style(WHITE.mix(0.9))
            .label_font((FONT, 12))
            .draw()?;
        root.present()?;
    }
    Ok(Some(Chart {
        name: format!("{}-sweep", slug(info.name)),
        caption: format!(
            "{}: {metric} per {}, median of rounds with min-max bars",
            info.name, sweep.header
        ),
        svg,
    }))
}

/// The primary metric per case as grouped bars (a group per case, a bar per transport), median with min-max.
fn cases(info: &Info, runs: &[&RunResult], look: &Look) -> Result<Option<Chart>> {
    let (metric, _) = info.primary;
    let names = transports(runs);
    let mut labels: Vec<String> = Vec::new();
    for r in runs {
        let l = case_of(Some(info), r);
        if !labels.contains(&l) {
            labels.push(l);
        }
    }
    // (slot, transport, median, min, max): each case takes a slot per transport and one empty slot.
    let width = names.len() + 1;
    let mut bars: Vec<(usize, &str, f64, f64, f64)> = Vec::new();
    for (i, label) in labels.iter().enumerate() {
        for (j, t) in names.iter().enumerate() {
            let values: Vec<f64> = runs
                .iter()
                .filter(|r| who(r) == *t && case_of(Some(info), r) == *label)
                .filter_map(|r| r.metric(metric))
                .collect();
            if let Some((m, lo, hi)) = summary(&values) {
                bars.push((i * width + j, t, m, lo, hi));
            }
        }
    }
    if bars.is_empty() {
        return Ok(None);
    }
    let slots = labels.len() * width - 1;
    let top = bars
        .iter()
        .map(|b| b.4)
        .fold(0.0, f64::max)
        .max(f64::MIN_POSITIVE)
        * headroom(names.len());
    let unit = info
        .metrics
        .iter()
        .find(|m| m.key == metric)
        .map_or("", |m| m.unit);
    // Short labels under each group: the case's values; the keys go in the axis description.
    let short: Vec<String> = labels
        .iter()
        .map(|l| {
            l.split(", ")
                .filter_map(|kv| kv.split_once('=').map(|(_, v)| v.to_string()))
                .collect::<Vec<_>>()
                .join(" · ")
        })
        .collect();
    let label_at = |slot: i32| -> String {
        let slot = slot as usize;
        let group = slot / width;
        // the label sits under the middle bar of its group
        if slot % width == names.len().saturating_sub(1) / 2 {
            short.get(group).cloned().unwrap_or_default()
        } else {
            String::new()
        }
    };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(format!("{}: {metric}", info.name), (FONT, 16))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(72)
            .build_cartesian_2d((0..slots as i32).into_segmented(), 0.0..top)?;
        let formatter = |v: &SegmentValue<i32>| match v {
            SegmentValue::CenterOf(s) => label_at(*s),
            _ => String::new(),
        };
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(slots + 1)
            .x_label_formatter(&formatter)
            .x_desc(info.case_keys.join(" · "))
            .y_desc(format!("{metric} ({unit})"))
            .y_label_formatter(&axis)
            .light_line_style(WHITE.mix(0.0))
            .draw()?;
        for t in &names {
            // pale when not to be trusted
            let colour = look
                .colour(t)
                .mix(if look.doubtful(t) { 0.35 } else { 1.0 });
            let mine: Vec<_> = bars.iter().filter(|b| b.1 == *t).collect();
            chart
                .draw_series(mine.iter().map(|b| {
                    let s = b.0 as i32;
                    let mut r = Rectangle::new(
                        [
                            (SegmentValue::Exact(s), 0.0),
                            (SegmentValue::Exact(s + 1), b.2),
                        ],
                        colour.filled(),
                    );
                    r.set_margin(0, 0, 3, 3);
                    r
                }))?
                .label(look.label(t))
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 12, y + 5)], colour.filled())
                });
            chart.draw_series(mine.iter().map(|b| {
                ErrorBar::new_vertical(
                    SegmentValue::CenterOf(b.0 as i32),
                    b.3,
                    b.2,
                    b.4,
                    BLACK.stroke_width(1),
                    6,
                )
            }))?;
        }
        chart
            .configure_series_labels()
            .border_style(BLACK.mix(0.3))
            .background_style(WHITE.mix(0.9))
            .label_font((FONT, 12))
            .draw()?;
        root.present()?;
    }
    Ok(Some(Chart {
        name: format!("{}-cases", slug(info.name)),
        caption: format!(
            "{}: {metric} per case{}, median of rounds with min-max bars",
            info.name,
            if info.case_keys.is_empty() {
                String::new()
            } else {
                format!(" ({})", info.case_keys.join(" · "))
            }
        ),
        svg,
    }))
}

/// A point of a percentile plot: `1/(1-p)` and the latency in ms.
fn percentile_points(h: &hdrhistogram::Histogram<u64>) -> Vec<(f64, f64)> {
    let n = h.len() as f64;
    let mut out: Vec<(f64, f64)> = h
        .iter_quantiles(5)
        .map(|v| (v.quantile_iterated_to(), v.value_iterated_to() as f64 / 1e3))
        .filter(|(q, _)| *q < 1.0)
        .map(|(q, ms)| (1.0 / (1.0 - q), ms))
        // Beyond 1 in n the iterator only repeats the maximum.
        .filter(|(x, _)| *x < n)
        .collect();
    // The slowest sample sits at 1 in n.
    if h.len() > 1 {
        out.push((n, h.max() as f64 / 1e3));
    }
    out
}

/// The percentile an x of `1/(1-p)` stands for: 90%, 99%, 99.9%.
fn percentile_label(x: f64) -> String {
    if x <= 1.0 {
        return "0%".into();
    }
    let p = (1.0 - 1.0 / x) * 100.0;
    let decimals = (x.log10().round() as i32 - 2).max(0) as usize;
    format!("{p:.decimals$}%")
}

/// Latency percentile plots: per case and histogram, a line per transport (rounds merged).
fn percentiles(
    workload: &str,
    info: Option<&Info>,
    runs: &[&RunResult],
    look: &Look,
) -> Result<Vec<Chart>> {
    // (case, histogram name) in the order they first appear.
    let mut keys: Vec<(String, String)> = Vec::new();
    for r in runs {
        for name in r.histograms.keys() {
            let k = (case_of(info, r), name.clone());
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
    }
    let mut out = Vec::new();
    for (case, name) in keys {
        let mut series: Vec<Line> = Vec::new();
        for t in transports(runs) {
            let mut merged: Option<hdrhistogram::Histogram<u64>> = None;
            for r in runs
                .iter()
                .filter(|r| who(r) == *t && case_of(info, r) == case)
            {
                let Some(h) = r
                    .histograms
                    .get(&name)
                    .and_then(|e| workloads::hist::decode(e).ok())
                else {
                    continue;
                };
                match &mut merged {
                    Some(m) => m.add(&h)?,
                    None => merged = Some(h),
                }
            }
            if let Some(h) = merged.filter(|h| !h.is_empty()) {
                series.push((t, percentile_points(&h), h.len()));
            }
        }
        if series.is_empty() {
            continue;
        }
        let most = series.iter().map(|s| s.2).max().unwrap_or(10).max(10) as f64;
        let x_max = 10f64.powf(most.log10().ceil()).max(100.0);
        let all = || series.iter().flat_map(|s| s.1.iter());
        let top = all().map(|p| p.1).fold(0.0, f64::max).max(0.001);
        let tails: Vec<f64> = series
            .iter()
            .filter_map(|s| s.1.last().map(|p| p.1))
            .filter(|v| *v > 0.0)
            .collect();
        let spread = tails.iter().copied().fold(0.0, f64::max)
            / tails.iter().copied().fold(f64::INFINITY, f64::min);
        let title = if case.is_empty() {
            format!("{workload}: {name}")
        } else {
            format!("{workload} ({case}): {name}")
        };
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
            root.fill(&WHITE)?;
            let mut builder = ChartBuilder::on(&root);
            builder
                .caption(&title, (FONT, 16))
                .margin(12)
                .x_label_area_size(36)
                .y_label_area_size(64);
            let x = (1.0..x_max).log_scale();
            let formatter = |x: &f64| percentile_label(*x);
            // The same drawing on either y axis (their coordinate types differ, so a macro rather than a function).
            macro_rules! draw {
                ($chart:expr, $y_desc:expr) => {{
                    let mut chart = $chart;
                    chart
                        .configure_mesh()
                        .x_label_formatter(&formatter)
                        .x_desc("percentile")
                        .y_desc($y_desc)
                        .y_label_formatter(&axis)
                        .light_line_style(WHITE.mix(0.0))
                        .draw()?;
                    for (t, points, _) in &series {
                        look.line(&mut chart, points.clone(), t, 2)?;
                    }
                    chart
                        .configure_series_labels()
                        .position(SeriesLabelPosition::UpperLeft)
                        .border_style(BLACK.mix(0.3))
                        .background_style(WHITE.mix(0.9))
                        .label_font((FONT, 12))
                        .draw()?;
                }};
            }
            if spread > 20.0 {
                let bottom = all()
                    .map(|p| p.1)
                    .filter(|v| *v > 0.0)
                    .fold(f64::INFINITY, f64::min)
                    * 0.8;
                draw!(
                    builder.build_cartesian_2d(x, (bottom..top * 1.5).log_scale())?,
                    "latency, ms (log scale)"
                );
            } else {
                draw!(
                    builder.build_cartesian_2d(x, 0.0..top * 1.1)?,
                    "latency, ms"
                );
            }
            root.present()?;
        }
        out.push(Chart {
            name: format!("{}-{}-{}", slug(workload), slug(&case), slug(&name))
                .replace("--", "-"),
            caption: format!(
                "{title}: latency by percentile (x: 1/(1−p) on a log scale, as HdrHistogram plots it), rounds merged"
            ),
            svg,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The text of every <text> element, trimmed.
    fn texts(svg: &str) -> Vec<String> {
        svg.split("<text")
            .skip(1)
            .filter_map(|t| {
                let body = t.split_once('>')?.1;
                Some(body.split_once("</text>")?.0.trim().to_string())
            })
            .collect()
    }

    fn result(
        workload: &str,
        transport: &str,
        params: serde_json::Value,
        metrics: serde_json::Value,
    ) -> RunResult {
        serde_json::from_value::<RunResult>(serde_json::json!({
            "schema": 1, "workload": workload, "transport": transport, "round": 0, "params": params,
            "metrics": metrics, "histograms": {}, "provenance": {},
            "durability": {"sync": "batch", "store_fs": "ext4"}
        }))
        .unwrap()
    }

    #[test]
    fn the_timeline_draws_a_line_per_transport_and_the_kill() {
        let line = |t: &str, kill: u32| {
            result(
                "restart",
                t,
                serde_json::json!({}),
                serde_json::json!({"timeline": [1, 2, 3, 0, 2], "kill_bin": kill, "asym_ops_after": 0}),
            )
        };
        let one = all(&[line("pure", 3), line("quinn", 3)]).unwrap();
        assert_eq!(
            texts(&one[0].svg).iter().filter(|w| *w == "kill").count(),
            1,
            "a shared kill once"
        );
        let charts = all(&[line("pure", 3), line("quinn", 4)]).unwrap();
        let t = charts
            .iter()
            .find(|c| c.name == "restart-timeline")
            .unwrap();
        assert!(t.svg.starts_with("<svg"), "{}", &t.svg[..60]);
        let words = texts(&t.svg);
        assert!(words.iter().any(|w| w == "quinn"), "{words:?}");
        assert_eq!(
            words.iter().filter(|w| *w == "kill").count(),
            2,
            "{words:?}"
        );
        assert!(
            t.svg.matches("<polyline").count() >= 4,
            "two lines and two kill marks"
        );
        // A run that failed before its kill has no kill bin and no line.
        let failed = result(
            "restart",
            "pure",
            serde_json::json!({}),
            serde_json::json!({"timeline": [1, 2]}),
        );
        let charts = for_workload("restart", &[&failed], &Palette::default()).unwrap();
        assert!(charts.iter().all(|c| c.name != "restart-timeline"));
    }

    #[test]
    fn a_transport_not_to_be_trusted_says_so() {
        let drain = |t: &str, lost: u64| {
            result(
                "drain",
                t,
                serde_json::json!({}),
                serde_json::json!({"orders_per_second": 10.0, "lost": lost}),
            )
        };
        let charts = all(&[drain("plain", 0), drain("sealed", 2)]).unwrap();
        let words = texts(&charts[0].svg);
        assert!(words.iter().any(|w| w == "plain"), "{words:?}");
        assert!(
            words.iter().any(|w| w == "sealed (not to be trusted)"),
            "{words:?}"
        );
    }

    #[test]
    fn percentile_axis_labels() {
        assert_eq!(percentile_label(1.0), "0%");
        assert_eq!(percentile_label(10.0), "90%");
        assert_eq!(percentile_label(100.0), "99%");
        assert_eq!(percentile_label(1000.0), "99.9%");
        assert_eq!(percentile_label(100_000.0), "99.999%");
    }

    #[test]
    fn percentile_points_follow_the_histogram() {
        let mut h = workloads::hist::new();
        for us in 1..=10_000u64 {
            h.record(us).unwrap();
        }
        let p = percentile_points(&h);
        assert!(
            p.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1),
            "monotonic"
        );
        let median = p.iter().find(|(x, _)| (*x - 2.0).abs() < 1e-9).unwrap();
        assert!((median.1 - 5.0).abs() < 0.05, "p50 of 1..10 ms: {median:?}");
        assert_eq!(p.last().unwrap().0, 10_000.0, "the max at 1 in n");
    }

    #[test]
    fn sweeps_and_cases_chart_the_primary_metric() {
        let fc = |t: &str, rtt: u64, rt: f64| {
            result(
                "first-contact",
                t,
                serde_json::json!({"rtt_ms": rtt}),
                serde_json::json!({"round_trips": rt}),
            )
        };
        let rs = [
            fc("pure", 10, 1.05),
            fc("quinn", 10, 2.1),
            fc("pure", 50, 1.02),
            fc("quinn", 50, 2.02),
        ];
        let charts = all(&rs).unwrap();
        let s = charts
            .iter()
            .find(|c| c.name == "first-contact-sweep")
            .unwrap();
        let words = texts(&s.svg);
        assert!(words.iter().any(|w| w == "pure"), "{words:?}");
        assert!(words.iter().any(|w| w.contains("round_trips")), "{words:?}");
        let drain = |t: &str, v: f64| {
            result(
                "drain",
                t,
                serde_json::json!({}),
                serde_json::json!({"orders_per_second": v}),
            )
        };
        let charts = all(&[drain("plain", 10.0), drain("sealed", 8.0)]).unwrap();
        let c = charts.iter().find(|c| c.name == "drain-cases").unwrap();
        assert!(
            c.svg.matches("<rect").count() >= 3,
            "background and two bars: {}",
            c.svg
        );
        // No data, no chart.
        assert!(all(&[result(
            "drain",
            "plain",
            serde_json::json!({}),
            serde_json::json!({})
        )])
        .unwrap()
        .is_empty());
    }
}
