//! `runner check` and `runner compare`: what CI can hold a change to.
//!
//! Checks never compare absolute times (machines here are shared and noisy). They are:
//!
//! - **every run's numbers can be trusted** ([`workloads::trust`]): no run that failed, timed out, left an order
//!   unanswered, acknowledged fewer orders than it made, lost an acknowledged order, applied one twice, was bound by
//!   its load generator, or synced its store on a memory filesystem; and the design's promises: `pure` does no
//!   asymmetric operation after a restart (the memo); no errors (handshake-rate's failed handshakes, unclosed links;
//!   idle-links' links that failed or were lost); publish/subscribe runs account for every expected delivery
//!   (`expected = delivered + dropped + lost_in_sockets + undelivered`, `undelivered = 0`, no duplicate delivery);
//! - **ratios measured side by side**: for each workload and case, each transport's primary metric over the first
//!   transport's in the same round of the same invocation (e.g. `pure:hpke-session` drain rate / `pure:plain`
//!   drain rate), median over rounds, compared with the same ratio in a baseline file: a ratio worse than the
//!   baseline's by more than the tolerance fails. Runs of different invocations are never divided by each other; a
//!   baseline holding several invocations is compared like with like (same workload, parameters and pair; the
//!   median over its invocations where more than one has the pair). Runs whose numbers cannot be trusted take no
//!   part in ratios.
//! - **hostile runs** ([`crate::hostile::checks`]): the server answered at the end, nothing applied that no one
//!   known made, nothing applied in another device's name where records are authenticated;
//!
//! `runner compare` (`compare.rs`) tells what changed between two files, with confidence intervals over rounds, for
//! the metrics and for these same-run ratios.

use std::collections::BTreeMap;
use tabled::builder::Builder;
use tabled::settings::Style;
use workloads::result::RunResult;
use workloads::workload::Better;

/// A workload's primary metric and whether higher is better.
fn primary(workload: &str) -> Option<(&'static str, bool)> {
    workloads::by_name(workload).map(|w| {
        let (metric, better) = w.info().primary;
        (metric, better == Better::Higher)
    })
}

/// The case a result belongs to (its workload's case keys and their values), empty for a single-case workload.
pub fn case(r: &RunResult) -> String {
    let keys = workloads::by_name(&r.workload)
        .map(|w| w.info().case_keys)
        .unwrap_or(&[]);
    keys.iter()
        .filter_map(|k| r.params.get(*k).map(|v| format!("{k}={v}")))
        .collect::<Vec<_>>()
        .join(" ")
}

/// One check and its outcome.
#[derive(Debug, Clone)]
pub struct Check {
    /// What was checked.
    pub what: String,
    /// The value found.
    pub found: String,
    /// What was expected.
    pub expected: String,
    /// Whether it holds.
    pub ok: bool,
    /// Whether a failure fails the check: false for a ratio whose reference is too noisy to hold it to
    /// (`--max-reference-spread`), which is reported and never fails.
    pub gated: bool,
}

impl Check {
    /// Whether this check fails the whole check.
    pub fn fails(&self) -> bool {
        self.gated && !self.ok
    }
}

/// The invariants of every run: its numbers can be trusted, and the design's promises hold.
#[cfg(test)]
pub fn invariants(results: &[RunResult]) -> Vec<Check> {
    invariants_with(results, &[])
}

/// [`invariants`], where a run whose only doubts are of the kinds in `allowed` (flags of [`workloads::trust`]:
/// [`GENERATOR_BOUND`](workloads::trust::GENERATOR_BOUND), a busy load generator;
/// [`SERVER_UNSATURATED`](workloads::trust::SERVER_UNSATURATED), a drain's server that waited for the devices)
/// passes: a smoke run on a small shared machine, whose timing is not the point. The check still names them.
pub fn invariants_with(results: &[RunResult], allowed: &[&str]) -> Vec<Check> {
    let mut out = Vec::new();
    for r in results.iter().filter(|r| r.skipped.is_none()) {
        let name = format!(
            "{} {} round {}",
            r.workload,
            crate::hostile::label(r),
            r.round
        );
        let flags = workloads::trust::flags(r);
        let failing = flags
            .iter()
            .filter(|f| !allowed.iter().any(|a| f.starts_with(a)))
            .count();
        out.push(Check {
            what: format!("{name}: numbers to be trusted"),
            found: match (flags.is_empty(), failing) {
                (true, _) => "yes".into(),
                (false, 0) => format!("{} (allowed)", flags.join("; ")),
                (false, _) => flags.join("; "),
            },
            expected: "no error, nothing unanswered, lost or twice, not generator-bound, server saturated (drain), durable"
                .into(),
            ok: failing == 0,
            gated: true,
        });
        out.extend(deliveries_accounted(&name, r));
        let memo = transport_pure::variant(&r.transport).is_some_and(|p| p.memo());
        if r.workload == "restart" && memo && r.error.is_none() {
            let v = r.metric("asym_ops_after").unwrap_or(f64::NAN);
            out.push(Check {
                what: format!("{name}: asymmetric operations after the restart (memo)"),
                found: fmt(v),
                expected: "0".into(),
                ok: v == 0.0,
                gated: true,
            });
        }
    }
    out.extend(crate::hostile::checks(results));
    out
}

/// A publish/subscribe run's accounting (docs/workloads.md): every expected delivery was delivered, or counted as
/// dropped by the server, or lost in a UDP socket the kernel counted drops on, or is undelivered (and
/// [`workloads::trust`] fails a run with anything undelivered). Runs without the four metrics have none; results
/// from before `lost_in_sockets` was recorded have none lost there.
fn deliveries_accounted(name: &str, r: &RunResult) -> Vec<Check> {
    let [Some(expected), Some(delivered), Some(dropped), Some(undelivered)] =
        ["expected", "delivered", "dropped", "undelivered"].map(|k| r.metric(k))
    else {
        return Vec::new();
    };
    let in_sockets = r.metric("lost_in_sockets").unwrap_or(0.0);
    vec![Check {
        what: format!("{name}: expected = delivered + dropped + lost in sockets + undelivered"),
        found: format!(
            "{} = {} + {} + {} + {}",
            fmt(expected),
            fmt(delivered),
            fmt(dropped),
            fmt(in_sockets),
            fmt(undelivered)
        ),
        expected: "equal".into(),
        ok: expected == delivered + dropped + in_sockets + undelivered,
        gated: true,
    }]
}

/// The key of a ratio: the workload with its case label, and the pair (`transport / reference`).
pub type RatioKey = (String, String);

/// The ratios of one invocation: per (workload and case, pair), the median over rounds of the transport's primary
/// metric divided by the reference's in the same round, and the parameters they were measured with.
#[derive(Debug, Clone, PartialEq)]
pub struct Ratio {
    /// The median ratio.
    pub value: f64,
    /// The parameters of the case, so that only like is compared with like.
    pub params: serde_json::Value,
}

/// Results grouped by invocation id, in the order invocations first appear.
pub fn by_invocation(results: &[RunResult]) -> Vec<(String, Vec<&RunResult>)> {
    let mut groups: Vec<(String, Vec<&RunResult>)> = Vec::new();
    for r in results {
        let id = &r.provenance.invocation;
        match groups.iter_mut().find(|(i, _)| i == id) {
            Some((_, rs)) => rs.push(r),
            None => groups.push((id.clone(), vec![r])),
        }
    }
    groups
}

/// The ratios of each invocation, separately.
pub fn ratios(results: &[RunResult]) -> Vec<(String, BTreeMap<RatioKey, Ratio>)> {
    by_invocation(results)
        .into_iter()
        .map(|(id, rs)| (id, invocation_ratios(&rs)))
        .collect()
}

/// The reference of a workload and case in one invocation: the transport that appears first.
fn reference<'a>(runs: &[&'a RunResult]) -> Option<&'a str> {
    runs.first().map(|r| r.transport.as_str())
}

/// The label of a case in ratio keys: the workload, and its case keys when it has any.
fn label(r: &RunResult) -> String {
    match case(r) {
        c if c.is_empty() => r.workload.clone(),
        c => format!("{} @{c}", r.workload),
    }
}

/// Ratios within one invocation's results.
fn invocation_ratios(results: &[&RunResult]) -> BTreeMap<RatioKey, Ratio> {
    // The runs of each case, in the order they appear (the reference is the first transport of its case).
    let mut cases: Vec<(String, &serde_json::Value, Vec<&RunResult>)> = Vec::new();
    for r in results.iter().copied() {
        if r.skipped.is_some() || !workloads::trust::trusted(r) {
            continue;
        }
        match cases
            .iter_mut()
            .find(|(w, p, _)| *w == r.workload && **p == r.params)
        {
            Some((_, _, rs)) => rs.push(r),
            None => cases.push((r.workload.clone(), &r.params, vec![r])),
        }
    }
    let mut per: BTreeMap<RatioKey, (Vec<f64>, serde_json::Value)> = BTreeMap::new();
    for (workload, params, runs) in cases {
        let Some((metric, _)) = primary(&workload) else {
            continue;
        };
        let Some(reference) = reference(&runs) else {
            continue;
        };
        let mut rounds: Vec<u32> = runs.iter().map(|r| r.round).collect();
        rounds.sort_unstable();
        rounds.dedup();
        for round in rounds {
            let at: Vec<&RunResult> = runs.iter().copied().filter(|r| r.round == round).collect();
            let Some(base) = at
                .iter()
                .find(|r| r.transport == reference)
                .and_then(|r| r.metric(metric))
                .filter(|&b| b != 0.0)
            else {
                continue;
            };
            for r in &at {
                if let Some(v) = r.metric(metric) {
                    per.entry((label(r), format!("{} / {reference}", r.transport)))
                        .or_insert_with(|| (Vec::new(), params.clone()))
                        .0
                        .push(v / base);
                }
            }
        }
    }
    per.into_iter()
        .filter_map(|(k, (v, params))| {
            crate::report::median(&v).map(|value| (k, Ratio { value, params }))
        })
        .collect()
}

/// Compare the ratios of each invocation of `current` with the same ratios (same workload, parameters and pair)
/// of `baseline`.
///
/// With `max_spread`, a ratio whose values in the baseline's invocations differ by more than that (`max/min - 1`)
/// is reported but not gated: a reference that moves that much between two invocations of one build cannot tell a
/// slower commit from the noise; nor can a ratio the baseline holds from one invocation only, whose noise is
/// unknown. Without it every ratio is gated.
pub fn against_baseline(
    current: &[RunResult],
    baseline: &[RunResult],
    tolerance: f64,
    max_spread: Option<f64>,
) -> Vec<Check> {
    let base = ratios(baseline);
    let mut out = Vec::new();
    for (invocation, now) in ratios(current) {
        for (key, ratio) in &now {
            let like: Vec<f64> = base
                .iter()
                .filter_map(|(_, b)| b.get(key))
                .filter(|b| b.params == ratio.params)
                .map(|b| b.value)
                .collect();
            let Some(expected) = crate::report::median(&like) else {
                continue;
            };
            let spread = spread(&like);
            let gated = match max_spread {
                Some(max) => like.len() >= 2 && spread <= max,
                None => true,
            };
            let (workload, pair) = key;
            let name = workload.split(' ').next().unwrap_or(workload);
            let higher_better = primary(name).is_some_and(|(_, h)| h);
            let bound = if higher_better {
                expected * (1.0 - tolerance)
            } else {
                expected * (1.0 + tolerance)
            };
            let ok = if higher_better {
                ratio.value >= bound
            } else {
                ratio.value <= bound
            };
            out.push(Check {
                what: format!("{workload}: {pair} (invocation {})", short(&invocation)),
                found: format!("{:.3}", ratio.value),
                expected: format!(
                    "{} {bound:.3} (baseline {expected:.3}, {} invocation(s){})",
                    if higher_better { ">=" } else { "<=" },
                    like.len(),
                    if like.len() >= 2 {
                        format!(", spread {:.1}%", spread * 100.0)
                    } else {
                        String::new()
                    }
                ),
                ok,
                gated,
            });
        }
    }
    out
}

/// How far apart values are: `max/min - 1` (0 for one value; infinite when they differ in sign or touch zero).
fn spread(values: &[f64]) -> f64 {
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if values.len() < 2 || min == max {
        0.0
    } else if min <= 0.0 {
        f64::INFINITY
    } else {
        max / min - 1.0
    }
}

fn short(invocation: &str) -> &str {
    if invocation.is_empty() {
        "unknown"
    } else {
        &invocation[..invocation.len().min(8)]
    }
}

/// Render checks as a Markdown table.
pub fn render(checks: &[Check]) -> String {
    let mut b = Builder::default();
    b.push_record(["check", "found", "expected", ""]);
    for c in checks {
        b.push_record([
            c.what.clone(),
            c.found.clone(),
            c.expected.clone(),
            match (c.ok, c.gated) {
                (true, true) => "ok",
                (false, true) => "FAIL",
                (true, false) => "ok (not gated)",
                (false, false) => "worse (not gated)",
            }
            .into(),
        ]);
    }
    let mut t = b.build();
    t.with(Style::markdown());
    t.to_string()
}

/// Why a run's numbers cannot be trusted, or what it broke: [`workloads::trust`]'s reasons and the run's other
/// failed invariants (the memo, deliveries accounted for, the hostile checks). Empty when nothing says so. The report
/// marks such runs; compare and export leave them out.
pub fn distrust(r: &RunResult) -> Vec<String> {
    let mut out = workloads::trust::flags(r);
    for c in invariants_with(std::slice::from_ref(r), &[]) {
        if c.ok || c.what.ends_with(": numbers to be trusted") {
            continue;
        }
        let what = c.what.split_once(": ").map_or(c.what.as_str(), |(_, w)| w);
        out.push(format!("{what}: {}", c.found));
    }
    out
}

fn fmt(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v}")
    } else {
        format!("{v:.3}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use workloads::result::{Provenance, SCHEMA};

    fn run(invocation: &str, transport: &str, round: u32, rate: f64, lost: f64) -> RunResult {
        RunResult {
            schema: SCHEMA,
            workload: "drain".into(),
            transport: transport.into(),
            round,
            params: serde_json::json!({}),
            metrics: [
                ("orders_per_second".to_string(), rate.into()),
                ("lost".to_string(), lost.into()),
            ]
            .into_iter()
            .collect(),
            histograms: Default::default(),
            provenance: Provenance {
                invocation: invocation.into(),
                ..Provenance::default()
            },
            skipped: None,
            durability: Some(workloads::durability::Durability {
                sync: "batch".into(),
                store_fs: "ext4".into(),
                ..Default::default()
            }),
            error: None,
        }
    }

    fn failures(checks: &[Check]) -> usize {
        checks.iter().filter(|c| !c.ok).count()
    }

    #[test]
    fn invariants_catch_a_lost_order_an_error_and_a_generator_bound_run() {
        let mut rs = vec![run("i", "a", 0, 10.0, 0.0), run("i", "b", 0, 10.0, 3.0)];
        assert_eq!(failures(&invariants(&rs)), 1);
        let mut failed = run("i", "c", 0, 10.0, 0.0);
        failed.error = Some("server statistics: missing field `counters`".into());
        rs.push(failed);
        let mut bound = run("i", "d", 0, 10.0, 0.0);
        bound.metrics.insert("generator_bound".into(), 1.into());
        rs.push(bound);
        let checks = invariants(&rs);
        assert_eq!(failures(&checks), 3);
        assert!(checks.iter().any(|c| c.found.contains("missing field")));
        // Allowed, a generator-bound run passes and is still named; the other two still fail.
        let checks = invariants_with(&rs, &[workloads::trust::GENERATOR_BOUND]);
        assert_eq!(failures(&checks), 2);
        assert!(checks
            .iter()
            .any(|c| c.ok && c.found == "generator-bound (allowed)"));
    }

    #[test]
    fn an_unsaturated_drain_fails_unless_allowed_and_takes_no_part_in_ratios() {
        let mut waited = run("i", "b", 0, 10.0, 0.0);
        waited.metrics.insert("server_busy".into(), 0.6.into());
        let rs = vec![run("i", "a", 0, 10.0, 0.0), waited];
        let checks = invariants(&rs);
        assert_eq!(failures(&checks), 1);
        let named = |c: &Check| c.found.starts_with(workloads::trust::SERVER_UNSATURATED);
        assert!(checks.iter().any(|c| !c.ok && named(c)));
        // Allowing a busy generator does not allow it; allowing it passes it, still named.
        let bound_only = invariants_with(&rs, &[workloads::trust::GENERATOR_BOUND]);
        assert_eq!(failures(&bound_only), 1);
        let allowed = invariants_with(&rs, &[workloads::trust::SERVER_UNSATURATED]);
        assert_eq!(failures(&allowed), 0);
        assert!(allowed
            .iter()
            .any(|c| c.ok && named(c) && c.found.ends_with("(allowed)")));
        // Its rate is not the server's: no ratio is made with it.
        let key = ("drain".to_string(), "b / a".to_string());
        assert!(!ratios(&rs)[0].1.contains_key(&key));
        let mut fed = rs.clone();
        fed[1].metrics.insert("server_busy".into(), 0.95.into());
        assert!(
            ratios(&fed)[0].1.contains_key(&key),
            "the same pair, saturated"
        );
    }

    #[test]
    fn invariants_catch_errors() {
        let mut r = run("i", "a", 0, 10.0, 0.0);
        r.metrics.insert("errors".into(), 0.into());
        assert!(invariants(std::slice::from_ref(&r)).iter().all(|c| c.ok));
        r.metrics.insert("errors".into(), 2.into());
        let failed: Vec<_> = invariants(&[r]).into_iter().filter(|c| !c.ok).collect();
        assert_eq!(failed.len(), 1);
        assert!(failed[0].found.contains("2 errors"), "{}", failed[0].found);
    }

    #[test]
    fn a_delivery_missing_without_a_count_fails() {
        let pubsub = |expected: f64, delivered: f64, dropped: f64, undelivered: f64| {
            let mut r = run("i", "quinn", 0, 1.0, 0.0);
            r.workload = "fanout".into();
            r.metrics.remove("lost");
            for (k, v) in [
                ("expected", expected),
                ("delivered", delivered),
                ("dropped", dropped),
                ("undelivered", undelivered),
                ("duplicates", 0.0),
            ] {
                r.metrics.insert(k.into(), v.into());
            }
            invariants(&[r])
        };
        let failed = |checks: Vec<Check>| checks.iter().filter(|c| !c.ok).count();
        assert_eq!(failed(pubsub(100.0, 90.0, 10.0, 0.0)), 0);
        // Something missing without a count.
        assert_eq!(failed(pubsub(100.0, 90.0, 5.0, 5.0)), 1);
        // The server counted more than it failed to deliver.
        assert_eq!(failed(pubsub(100.0, 95.0, 10.0, 0.0)), 1);
        // Lost in sockets the kernel counted drops on: accounted for.
        let mut checks = pubsub(100.0, 90.0, 5.0, 0.0);
        assert_eq!(failed(checks.clone()), 1);
        checks = {
            let mut r = run("i", "pure", 0, 1.0, 0.0);
            r.workload = "flood".into();
            r.metrics.remove("lost");
            for (k, v) in [
                ("expected", 100.0),
                ("delivered", 90.0),
                ("dropped", 5.0),
                ("lost_in_sockets", 5.0),
                ("undelivered", 0.0),
                ("duplicates", 0.0),
            ] {
                r.metrics.insert(k.into(), v.into());
            }
            invariants(&[r])
        };
        assert_eq!(failed(checks), 0);
        // A run without the accounting is not checked for it.
        assert!(invariants(&[run("i", "a", 0, 1.0, 0.0)])
            .iter()
            .all(|c| c.ok));
    }

    #[test]
    fn ratios_are_per_round_against_the_first_transport() {
        let rs = [
            run("x", "plain", 0, 100.0, 0.0),
            run("x", "sealed", 0, 90.0, 0.0),
            run("x", "sealed", 1, 50.0, 0.0),
            run("x", "plain", 1, 50.0, 0.0),
        ];
        let r = ratios(&rs);
        assert_eq!(r.len(), 1);
        assert_eq!(
            r[0].1[&("drain".to_string(), "sealed / plain".to_string())].value,
            0.95
        );
        let base = [
            run("y", "plain", 0, 10.0, 0.0),
            run("y", "sealed", 0, 10.0, 0.0),
        ];
        let checks = against_baseline(&rs, &base, 0.02, None);
        let c = checks.iter().find(|c| c.what.contains("sealed")).unwrap();
        assert!(!c.ok, "0.95 is worse than 1.0 by more than 2%");
        assert!(against_baseline(&rs, &base, 0.10, None)
            .iter()
            .all(|c| c.ok));
    }

    #[test]
    fn a_ratio_whose_reference_moves_is_reported_not_gated() {
        let rs = [
            run("x", "plain", 0, 100.0, 0.0),
            run("x", "sealed", 0, 40.0, 0.0),
        ];
        // The reference holds sealed/plain at 0.9 and 1.0 (11% apart) in two invocations.
        let base = [
            run("a", "plain", 0, 10.0, 0.0),
            run("a", "sealed", 0, 9.0, 0.0),
            run("b", "plain", 0, 10.0, 0.0),
            run("b", "sealed", 0, 10.0, 0.0),
        ];
        let gated = against_baseline(&rs, &base, 0.5, Some(0.2));
        let c = gated.iter().find(|c| c.what.contains("sealed")).unwrap();
        assert!(c.gated && c.fails(), "0.4 against 0.95 fails a gate of 50%");
        assert!(c.expected.contains("spread 11.1%"), "{}", c.expected);
        let noisy = against_baseline(&rs, &base, 0.5, Some(0.05));
        let c = noisy.iter().find(|c| c.what.contains("sealed")).unwrap();
        assert!(!c.ok && !c.gated && !c.fails());
        assert!(render(&noisy).contains("worse (not gated)"));
        // One invocation in the reference: its noise is unknown, so the ratio is gated only without a spread.
        let one = against_baseline(&rs, &base[..2], 0.5, Some(1.0));
        assert!(one.iter().all(|c| !c.gated));
        assert!(against_baseline(&rs, &base[..2], 0.5, None)
            .iter()
            .any(|c| c.fails()));
        assert_eq!(spread(&[1.0]), 0.0);
        assert!(spread(&[0.0, 1.0]).is_infinite());
    }

    #[test]
    fn ratios_never_cross_invocations() {
        // The reference ran in one invocation, the other transport in another: no ratio at all.
        let rs = [
            run("x", "plain", 0, 100.0, 0.0),
            run("y", "sealed", 0, 50.0, 0.0),
        ];
        assert!(
            ratios(&rs).iter().all(|(_, r)| r.len() == 1),
            "only x/x and y/y"
        );
        // Two invocations, each with its own reference: each ratio is its own.
        let rs = [
            run("x", "plain", 0, 100.0, 0.0),
            run("x", "sealed", 0, 50.0, 0.0),
            run("y", "plain", 0, 10.0, 0.0),
            run("y", "sealed", 0, 9.0, 0.0),
        ];
        let key = ("drain".to_string(), "sealed / plain".to_string());
        let values: Vec<f64> = ratios(&rs).iter().map(|(_, r)| r[&key].value).collect();
        assert_eq!(values, vec![0.5, 0.9]);
        // Different parameters are not like with like.
        let mut other = [
            run("z", "plain", 0, 10.0, 0.0),
            run("z", "sealed", 0, 1.0, 0.0),
        ];
        for r in &mut other {
            r.params = serde_json::json!({"orders": 5});
        }
        assert!(against_baseline(&rs, &other, 0.1, None).is_empty());
    }

    #[test]
    fn untrusted_runs_take_no_part_in_ratios() {
        let mut sealed = run("x", "sealed", 0, 50.0, 0.0);
        sealed.metrics.insert("timed_out".into(), 1.into());
        let rs = [run("x", "plain", 0, 100.0, 0.0), sealed];
        let key = ("drain".to_string(), "sealed / plain".to_string());
        assert!(!ratios(&rs)[0].1.contains_key(&key));
    }
}
