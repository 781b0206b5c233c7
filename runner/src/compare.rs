//! `runner compare A B`: what changed from results A to results B, with a confidence interval over rounds.
//!
//! For each workload case (same workload, same parameters in both files), transport and judged metric (the
//! workload's primary metric and every column with a direction, [`workloads::workload::Info::judged`]), the rounds
//! of A and the rounds of B are two samples. The change is the Hodges-Lehmann shift (the median of every difference
//! B round − A round) and its interval the distribution-free one that goes with the Mann-Whitney rank test: the
//! k-th smallest and k-th largest of those differences, k chosen from the exact null distribution of the rank
//! statistic so that the interval covers the true shift with at least the asked confidence (95% by default). It
//! assumes only that B's rounds are A's shifted, no normal distribution, and it needs no random numbers, so the same
//! files always give the same answer.
//!
//! Few rounds cannot give 95%: with 3 rounds against 3 the widest interval (smallest to largest difference) covers
//! the shift with 90% confidence, and that is what is shown, with the confidence it really has. Under 80% the row
//! says "too few rounds". As criterion does for microbenchmarks, an interval that spans zero is "no change";
//! otherwise the change is judged by the metric's direction: "better" or "worse".
//!
//! Runs whose numbers cannot be trusted (a failed invariant, [`crate::check::distrust`]) take no part; they are
//! counted under the table.

use crate::report::{median, thousands};
use std::collections::BTreeMap;
use tabled::builder::Builder;
use tabled::settings::Style;
use workloads::result::RunResult;
use workloads::workload::Better;

/// The lowest confidence an interval may have and still be judged.
pub const MIN_CONFIDENCE: f64 = 0.8;

/// A shift between two samples and its interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shift {
    /// The Hodges-Lehmann estimate: the median of the pairwise differences b − a.
    pub estimate: f64,
    /// The interval's lower end.
    pub low: f64,
    /// The interval's upper end.
    pub high: f64,
    /// The interval's real coverage (at least the level asked for, when the rounds allow it).
    pub confidence: f64,
}

/// What a change amounts to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The interval spans zero.
    NoChange,
    /// The metric moved the way its column calls better.
    Better,
    /// The metric moved the other way.
    Worse,
    /// The metric moved, and it has no direction.
    Changed,
    /// Not enough rounds for an interval of [`MIN_CONFIDENCE`].
    TooFewRounds,
}

impl Verdict {
    fn text(self) -> &'static str {
        match self {
            Verdict::NoChange => "no change",
            Verdict::Better => "better",
            Verdict::Worse => "worse",
            Verdict::Changed => "changed",
            Verdict::TooFewRounds => "too few rounds",
        }
    }
}

/// Judge a shift by the metric's direction.
pub fn verdict(shift: &Shift, better: Option<Better>) -> Verdict {
    if shift.confidence < MIN_CONFIDENCE {
        return Verdict::TooFewRounds;
    }
    let up = if shift.low > 0.0 {
        true
    } else if shift.high < 0.0 {
        false
    } else {
        return Verdict::NoChange;
    };
    match (better, up) {
        (None, _) => Verdict::Changed,
        (Some(Better::Higher), true) | (Some(Better::Lower), false) => Verdict::Better,
        _ => Verdict::Worse,
    }
}

/// `P(U ≤ u)` for u = 0..=n·m, U the Mann-Whitney statistic of samples of n and m under the null hypothesis
/// (every ordering of the n + m values equally likely).
fn rank_cdf(n: usize, m: usize) -> Vec<f64> {
    // ways[j][u]: orderings of i values of the first sample and j of the second with statistic u; built up over i
    // by the usual recurrence (the largest value belongs to one sample or the other). Counts as f64: exact up to
    // 2^53, far beyond the rounds anyone runs.
    let mut prev: Vec<Vec<f64>> = (0..=m).map(|_| vec![1.0]).collect();
    for i in 1..=n {
        let mut cur: Vec<Vec<f64>> = vec![vec![1.0]];
        for j in 1..=m {
            let mut w = vec![0.0; i * j + 1];
            // the largest is the first sample's: it beats all j of the second
            for (u, c) in prev[j].iter().enumerate() {
                w[u + j] += c;
            }
            // the largest is the second sample's
            for (u, c) in cur[j - 1].iter().enumerate() {
                w[u] += c;
            }
            cur.push(w);
        }
        prev = cur;
    }
    let ways = &prev[m];
    let total: f64 = ways.iter().sum();
    let mut acc = 0.0;
    ways.iter()
        .map(|c| {
            acc += c;
            acc / total
        })
        .collect()
}

/// The Hodges-Lehmann shift from `a` to `b` and its distribution-free interval at `level` (e.g. 0.95), or the
/// widest interval the rounds allow when they cannot reach it. `None` when a sample is empty.
pub fn shift(a: &[f64], b: &[f64], level: f64) -> Option<Shift> {
    if a.is_empty() || b.is_empty() {
        return None;
    }
    let mut d: Vec<f64> = b
        .iter()
        .flat_map(|y| a.iter().map(move |x| y - x))
        .collect();
    d.sort_by(f64::total_cmp);
    let estimate = median(&d)?;
    let cdf = rank_cdf(a.len(), b.len());
    let alpha = 1.0 - level;
    // The interval [d(k), d(nm+1-k)] (1-based) misses the shift with probability 2·P(U ≤ k−1): the largest k that
    // keeps that within alpha, or k = 1 when even the widest interval cannot.
    let c = cdf.iter().take_while(|p| **p <= alpha / 2.0).count();
    let k = c.max(1);
    let confidence = (1.0 - 2.0 * cdf[k - 1]).max(0.0);
    Some(Shift {
        estimate,
        low: d[k - 1],
        high: d[d.len() - k],
        confidence,
    })
}

/// One compared metric.
#[derive(Debug, Clone)]
pub struct Row {
    /// The workload and its case label.
    pub case: String,
    /// The metric.
    pub metric: String,
    /// The transport.
    pub transport: String,
    /// A's rounds.
    pub a: Vec<f64>,
    /// B's rounds.
    pub b: Vec<f64>,
    /// The change and its interval.
    pub shift: Shift,
    /// What it amounts to.
    pub verdict: Verdict,
}

/// What could not be compared, for the lines under the table.
#[derive(Debug, Default)]
pub struct Notes {
    /// Runs left out because their numbers cannot be trusted, per file.
    pub untrusted: [usize; 2],
    /// Cases (workload, parameters) in only one of the files, per file.
    pub unmatched: [Vec<String>; 2],
    /// Workloads this runner does not know (no directions to judge by).
    pub unknown: Vec<String>,
}

/// The key of a group of rounds: workload, parameters (as JSON text, so that only like is compared with like), and
/// transport.
pub type Key = (String, String, String);

fn groups<'a>(
    results: &'a [RunResult],
    untrusted: &mut usize,
) -> BTreeMap<Key, Vec<&'a RunResult>> {
    let mut out: BTreeMap<Key, Vec<&'a RunResult>> = BTreeMap::new();
    for r in results.iter().filter(|r| r.skipped.is_none()) {
        if !crate::check::distrust(r).is_empty() {
            *untrusted += 1;
            continue;
        }
        out.entry((
            r.workload.clone(),
            r.params.to_string(),
            crate::hostile::label(r),
        ))
        .or_default()
        .push(r);
    }
    out
}

/// Compare every metric with a direction of every case and transport found in both files.
pub fn compare(a: &[RunResult], b: &[RunResult], level: f64) -> (Vec<Row>, Notes) {
    let mut notes = Notes::default();
    let ga = groups(a, &mut notes.untrusted[0]);
    let gb = groups(b, &mut notes.untrusted[1]);
    let label = |runs: &[&RunResult]| {
        let r = runs[0];
        match crate::check::case(r) {
            c if c.is_empty() => r.workload.clone(),
            c => format!("{} @{c}", r.workload),
        }
    };
    for (i, (mine, theirs)) in [(&ga, &gb), (&gb, &ga)].into_iter().enumerate() {
        for (key, runs) in mine {
            if !theirs.contains_key(key) {
                let l = format!("{} ({})", label(runs), key.2);
                if !notes.unmatched[i].contains(&l) {
                    notes.unmatched[i].push(l);
                }
            }
        }
    }
    let mut rows = Vec::new();
    for (key, runs_a) in &ga {
        let Some(runs_b) = gb.get(key) else {
            continue;
        };
        let Some(info) = workloads::by_name(&key.0).map(|w| w.info()) else {
            if !notes.unknown.contains(&key.0) {
                notes.unknown.push(key.0.clone());
            }
            continue;
        };
        for (metric, better) in info.judged() {
            let values = |runs: &[&RunResult]| -> Vec<f64> {
                runs.iter().filter_map(|r| r.metric(metric)).collect()
            };
            let (va, vb) = (values(runs_a), values(runs_b));
            let Some(s) = shift(&va, &vb, level) else {
                continue;
            };
            rows.push(Row {
                case: label(runs_a),
                metric: metric.to_string(),
                transport: key.2.clone(),
                verdict: verdict(&s, Some(better)),
                a: va,
                b: vb,
                shift: s,
            });
        }
    }
    rows.extend(ratio_rows(a, b, level));
    (rows, notes)
}

/// Same-run ratios, the figure a noisy machine shifts least: per case, each transport's primary metric over the
/// reference's (the case's first transport in A) in the same round of the same invocation. The rounds' ratios of A
/// against B's, judged by the primary metric's direction.
fn ratio_rows(a: &[RunResult], b: &[RunResult], level: f64) -> Vec<Row> {
    let trusted = |r: &&RunResult| r.skipped.is_none() && crate::check::distrust(r).is_empty();
    // The cases in A's order: workload, parameters, label, reference.
    let mut cases: Vec<(String, &serde_json::Value, String, String)> = Vec::new();
    for r in a.iter().filter(trusted) {
        let params = &r.params;
        if !cases.iter().any(|c| c.0 == r.workload && c.1 == params) {
            let label = match crate::check::case(r) {
                c if c.is_empty() => r.workload.clone(),
                c => format!("{} @{c}", r.workload),
            };
            cases.push((r.workload.clone(), params, label, crate::hostile::label(r)));
        }
    }
    // Per transport, its ratio to the reference in each (invocation, round) where both have the metric.
    let ratios = |rs: &[RunResult],
                  workload: &str,
                  params: &serde_json::Value,
                  reference: &str,
                  metric: &str| {
        let mut at: BTreeMap<(String, u32), Vec<(String, f64)>> = BTreeMap::new();
        for r in rs.iter().filter(trusted) {
            if r.workload != workload || r.params != *params {
                continue;
            }
            if let Some(v) = r.metric(metric) {
                at.entry((r.provenance.invocation.clone(), r.round))
                    .or_default()
                    .push((crate::hostile::label(r), v));
            }
        }
        let mut out: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        for values in at.values() {
            let Some(base) = values
                .iter()
                .find(|(t, _)| t == reference)
                .map(|(_, v)| *v)
                .filter(|v| *v != 0.0)
            else {
                continue;
            };
            for (t, v) in values.iter().filter(|(t, _)| t != reference) {
                out.entry(t.clone()).or_default().push(v / base);
            }
        }
        out
    };
    let mut rows = Vec::new();
    for (workload, params, label, reference) in &cases {
        let Some(info) = workloads::by_name(workload).map(|w| w.info()) else {
            continue;
        };
        let (metric, better) = info.primary;
        let rb = ratios(b, workload, params, reference, metric);
        for (t, va) in ratios(a, workload, params, reference, metric) {
            let Some(vb) = rb.get(&t) else {
                continue;
            };
            let Some(s) = shift(&va, vb, level) else {
                continue;
            };
            rows.push(Row {
                case: label.clone(),
                metric: format!("{metric} ÷ {reference}, same round"),
                transport: t,
                verdict: verdict(&s, Some(better)),
                a: va,
                b: vb.clone(),
                shift: s,
            });
        }
    }
    rows
}

/// A value as the tables show it: thousands separators from 1,000 on, else up to three decimals.
pub fn number(v: f64) -> String {
    if v.abs() >= 1000.0 {
        thousands(v)
    } else if v.fract() == 0.0 {
        format!("{v}")
    } else {
        format!("{v:.3}")
    }
}

/// A change relative to A's median, or absolute when that median is zero.
fn relative(v: f64, base: f64) -> String {
    if base != 0.0 {
        format!("{:+.1}%", v / base.abs() * 100.0)
    } else {
        format!("{:+}", number(v))
    }
}

/// The comparison as a Markdown table, with the notes under it.
pub fn render(rows: &[Row], notes: &Notes, level: f64) -> String {
    let mut t = Builder::default();
    t.push_record([
        "case",
        "metric",
        "transport",
        "A median (rounds)",
        "B median (rounds)",
        "change",
        "interval",
        "confidence",
        "verdict",
    ]);
    for r in rows {
        let base = median(&r.a).unwrap_or(0.0);
        let side = |v: &[f64]| format!("{} ({})", number(median(v).unwrap_or(0.0)), v.len());
        t.push_record([
            r.case.clone(),
            r.metric.clone(),
            r.transport.clone(),
            side(&r.a),
            side(&r.b),
            relative(r.shift.estimate, base),
            format!(
                "{} to {}",
                relative(r.shift.low, base),
                relative(r.shift.high, base)
            ),
            format!("{:.0}%", r.shift.confidence * 100.0),
            r.verdict.text().to_string(),
        ]);
    }
    let mut t = t.build();
    t.with(Style::markdown());
    let mut out = format!("{t}\n");
    out.push_str(&format!(
        "\nChange: the median of every difference B round − A round (Hodges-Lehmann), relative to A's median; \
         interval: distribution-free (Mann-Whitney) at {:.0}%, or the widest the rounds allow. \
         \"÷ X, same round\": the primary metric over reference X's in the same round of the same invocation, \
         which a busy machine shifts least.\n",
        level * 100.0
    ));
    let count = |v: &[Verdict]| rows.iter().filter(|r| v.contains(&r.verdict)).count();
    out.push_str(&format!(
        "{} better, {} worse, {} no change, {} too few rounds.\n",
        count(&[Verdict::Better]),
        count(&[Verdict::Worse]),
        count(&[Verdict::NoChange]),
        count(&[Verdict::TooFewRounds]),
    ));
    for (i, side) in ["A", "B"].iter().enumerate() {
        if notes.untrusted[i] > 0 {
            out.push_str(&format!(
                "{side}: {} run(s) left out, their numbers not to be trusted (see `runner check`).\n",
                notes.untrusted[i]
            ));
        }
        if !notes.unmatched[i].is_empty() {
            out.push_str(&format!(
                "Only in {side} (or with other parameters): {}.\n",
                notes.unmatched[i].join("; ")
            ));
        }
    }
    if !notes.unknown.is_empty() {
        out.push_str(&format!(
            "Not compared, unknown to this runner: {}.\n",
            notes.unknown.join(", ")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use workloads::result::{Provenance, SCHEMA};

    #[test]
    fn the_rank_distribution_is_exact() {
        // 3 against 3: 20 orderings, one with U = 0.
        let c = rank_cdf(3, 3);
        assert_eq!(c.len(), 10);
        assert!((c[0] - 1.0 / 20.0).abs() < 1e-12);
        assert!((c[9] - 1.0).abs() < 1e-12);
        // Symmetric: P(U ≤ u) = P(U ≥ nm − u).
        let c = rank_cdf(4, 6);
        for u in 0..24 {
            assert!((c[u] - (1.0 - c[23 - u])).abs() < 1e-12, "{u}");
        }
        // 5 against 5, from tables: P(U ≤ 2) = 4/252.
        assert!((rank_cdf(5, 5)[2] - 4.0 / 252.0).abs() < 1e-12);
    }

    #[test]
    fn three_rounds_give_the_widest_interval_at_90_percent() {
        let s = shift(&[100.0, 102.0, 98.0], &[120.0, 118.0, 125.0], 0.95).unwrap();
        assert_eq!((s.low, s.high), (16.0, 27.0));
        assert_eq!(s.estimate, 20.0);
        assert!((s.confidence - 0.9).abs() < 1e-12);
        assert_eq!(verdict(&s, Some(Better::Higher)), Verdict::Better);
        assert_eq!(verdict(&s, Some(Better::Lower)), Verdict::Worse);
        assert_eq!(verdict(&s, None), Verdict::Changed);
    }

    #[test]
    fn overlapping_rounds_are_no_change() {
        let s = shift(&[100.0, 110.0, 90.0], &[105.0, 95.0, 112.0], 0.95).unwrap();
        assert!(s.low < 0.0 && s.high > 0.0, "{s:?}");
        assert_eq!(verdict(&s, Some(Better::Higher)), Verdict::NoChange);
    }

    #[test]
    fn more_rounds_reach_95_percent_and_narrow() {
        // Ten rounds each, B shifted by +5 with the same spread: the interval excludes 0 and holds 5.
        let a: Vec<f64> = (0..10).map(|i| 100.0 + f64::from(i % 5)).collect();
        let b: Vec<f64> = a.iter().map(|x| x + 5.0).collect();
        let s = shift(&a, &b, 0.95).unwrap();
        assert!(s.confidence >= 0.95, "{s:?}");
        assert!(s.low > 0.0 && s.low <= 5.0 && s.high >= 5.0, "{s:?}");
        assert!(s.high - s.low < 8.0, "narrower than the whole range: {s:?}");
        let widest = shift(&a, &b, 0.999_999).unwrap();
        assert!(widest.high - widest.low > s.high - s.low);
    }

    #[test]
    fn too_few_rounds_are_said() {
        let s = shift(&[1.0, 2.0], &[5.0, 6.0], 0.95).unwrap();
        assert!((s.confidence - (1.0 - 2.0 / 6.0)).abs() < 1e-12);
        assert_eq!(verdict(&s, Some(Better::Higher)), Verdict::TooFewRounds);
        assert!(shift(&[], &[1.0], 0.95).is_none());
    }

    fn run(transport: &str, round: u32, rate: f64) -> RunResult {
        RunResult {
            schema: SCHEMA,
            workload: "drain".into(),
            transport: transport.into(),
            round,
            params: serde_json::json!({"orders": 100}),
            metrics: [
                ("orders_per_second".to_string(), rate.into()),
                ("lost".to_string(), 0.into()),
            ]
            .into_iter()
            .collect(),
            histograms: Default::default(),
            provenance: Provenance::default(),
            skipped: None,
            durability: Some(workloads::durability::Durability {
                sync: "batch".into(),
                store_fs: "ext4".into(),
                ..Default::default()
            }),
            error: None,
        }
    }

    #[test]
    fn files_are_compared_case_by_case() {
        let a = [
            run("plain", 0, 100.0),
            run("plain", 1, 101.0),
            run("plain", 2, 99.0),
            run("sealed", 0, 90.0),
            run("sealed", 1, 91.0),
            run("sealed", 2, 89.0),
        ];
        let mut b = vec![
            run("plain", 0, 100.5),
            run("plain", 1, 99.5),
            run("plain", 2, 101.5),
            run("sealed", 0, 60.0),
            run("sealed", 1, 61.0),
            run("sealed", 2, 62.0),
        ];
        let mut lossy = run("plain", 3, 1.0);
        lossy.metrics.insert("lost".into(), 2.into());
        b.push(lossy);
        let mut other = run("plain", 0, 5.0);
        other.params = serde_json::json!({"orders": 5});
        b.push(other);
        let (rows, notes) = compare(&a, &b, 0.95);
        let rate = |t: &str| {
            rows.iter()
                .find(|r| r.transport == t && r.metric == "orders_per_second")
                .unwrap()
        };
        assert_eq!(rate("plain").verdict, Verdict::NoChange);
        assert_eq!(rate("sealed").verdict, Verdict::Worse);
        assert_eq!(rate("sealed").b.len(), 3);
        assert_eq!(rate("plain").b.len(), 3, "the lossy round is left out");
        assert_eq!(notes.untrusted, [0, 1]);
        // sealed / plain: 0.9 in A, 0.6 in B, round by round.
        let ratio = rows
            .iter()
            .find(|r| r.metric == "orders_per_second ÷ plain, same round")
            .unwrap();
        assert_eq!(
            (ratio.transport.as_str(), ratio.verdict),
            ("sealed", Verdict::Worse)
        );
        assert!((median(&ratio.a).unwrap() - 0.9).abs() < 0.01, "{ratio:?}");
        assert_eq!(notes.unmatched[1].len(), 1, "{:?}", notes.unmatched);
        let text = render(&rows, &notes, 0.95);
        assert!(text.contains("| worse"), "{text}");
        assert!(text.contains("-32.2%"), "{text}");
        assert!(text.contains("1 run(s) left out"), "{text}");
    }
}
