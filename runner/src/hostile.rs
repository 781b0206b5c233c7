//! Results of hostile runs (`runner run --hostile`): their rows, the tables that set them beside the clean runs, and
//! their checks.
//!
//! A hostile result carries `"hostile": true` in its parameters; its rows are labelled `TRANSPORT (hostile)`. For each
//! workload with hostile results the report adds:
//!
//! - the workload's primary metric clean and hostile side by side, with their ratio (medians over rounds), whether
//!   the server answered at the end, and the audit's figures for the adversary;
//! - what the adversary sent, by kind, and what the server counted, by counter (over all its starts), per transport.

use crate::check::Check;
use crate::report::{median, thousands};
use std::collections::BTreeMap;
use tabled::builder::Builder;
use tabled::settings::Style;
use workloads::result::RunResult;

/// Whether a result is of a hostile run.
pub fn is_hostile(r: &RunResult) -> bool {
    r.params.get("hostile").and_then(|v| v.as_bool()) == Some(true)
}

/// The row label of a result: its transport, marked when hostile.
pub fn label(r: &RunResult) -> String {
    if is_hostile(r) {
        format!("{} (hostile)", r.transport)
    } else {
        r.transport.clone()
    }
}

/// The server counters the tables show, in order.
const SERVER_COUNTERS: &[&str] = &[
    "refused_unknown",
    "refused_forged",
    "refused_malformed",
    "refused_oversized",
    "refused_limit",
    "refused_unroutable",
    "timed_out",
    "send_errors",
    "already_applied",
    "handshakes",
    "x25519",
];

/// The transport that applies anything that parses under any device's name: the unauthenticated ceiling.
const UNAUTHENTICATED: &str = "pure:plain";

fn med(runs: &[&RunResult], key: &str) -> Option<f64> {
    let values: Vec<f64> = runs.iter().filter_map(|r| r.metric(key)).collect();
    median(&values)
}

fn show(v: Option<f64>, decimals: bool) -> String {
    match v {
        None => "-".into(),
        Some(v) if decimals => format!("{v:.2}"),
        Some(v) => thousands(v),
    }
}

/// The hostile tables of every workload that has hostile results (empty if none).
pub fn tables(results: &[RunResult]) -> String {
    let mut workloads: Vec<&str> = Vec::new();
    for r in results
        .iter()
        .filter(|r| is_hostile(r) && r.skipped.is_none())
    {
        if !workloads.contains(&r.workload.as_str()) {
            workloads.push(&r.workload);
        }
    }
    let mut out = String::new();
    for w in workloads {
        let runs: Vec<&RunResult> = results
            .iter()
            .filter(|r| r.workload == w && r.skipped.is_none())
            .collect();
        out.push_str(&side_by_side(w, &runs));
        out.push_str(&by_kind(&runs));
    }
    out
}

/// Transports in the order they first appear, each with its clean and hostile runs.
fn per_transport<'a>(
    runs: &[&'a RunResult],
) -> Vec<(String, Vec<&'a RunResult>, Vec<&'a RunResult>)> {
    let mut out: Vec<(String, Vec<&RunResult>, Vec<&RunResult>)> = Vec::new();
    for r in runs {
        let i = match out.iter().position(|(t, _, _)| *t == r.transport) {
            Some(i) => i,
            None => {
                out.push((r.transport.clone(), Vec::new(), Vec::new()));
                out.len() - 1
            }
        };
        if is_hostile(r) {
            out[i].2.push(r);
        } else {
            out[i].1.push(r);
        }
    }
    out
}

fn side_by_side(workload: &str, runs: &[&RunResult]) -> String {
    let primary = workloads::by_name(workload)
        .map(|w| w.info().primary.0)
        .unwrap_or("make_to_stored_p99_ms");
    let mut b = Builder::default();
    b.push_record([
        "transport".to_string(),
        format!("{primary}, clean"),
        format!("{primary}, hostile"),
        "hostile / clean".into(),
        "server up at the end".into(),
        "unknown (applied, made by no one known)".into(),
        "applied in another device's name".into(),
        "adversary's own orders applied".into(),
        "adversary sent".into(),
        "adversary CPU s".into(),
    ]);
    for (t, clean, hostile) in per_transport(runs) {
        if hostile.is_empty() {
            continue;
        }
        let (c, h) = (med(&clean, primary), med(&hostile, primary));
        let ratio = match (c, h) {
            (Some(c), Some(h)) if c > 0.0 => format!("{:.2}", h / c),
            _ => "-".into(),
        };
        let up = hostile
            .iter()
            .filter(|r| r.metric("server_answered_end") == Some(1.0))
            .count();
        let sum = |key: &str| hostile.iter().filter_map(|r| r.metric(key)).sum::<f64>();
        b.push_record([
            t,
            show(c, true),
            show(h, true),
            ratio,
            format!("{up} of {}", hostile.len()),
            thousands(sum("unknown")),
            thousands(sum("adversary_forged_applied")),
            thousands(sum("adversary_own_applied")),
            show(med(&hostile, "adversary_sent"), false),
            show(med(&hostile, "adversary_cpu_s"), true),
        ]);
    }
    let mut table = b.build();
    table.with(Style::markdown());
    format!("### {workload}: clean and hostile (medians of rounds; counts summed)\n\n{table}\n\n")
}

fn by_kind(runs: &[&RunResult]) -> String {
    let groups: Vec<(String, Vec<&RunResult>)> = per_transport(runs)
        .into_iter()
        .filter(|(_, _, h)| !h.is_empty())
        .map(|(t, _, h)| (t, h))
        .collect();
    let mut kinds: BTreeMap<String, ()> = BTreeMap::new();
    for (_, hostile) in &groups {
        for r in hostile {
            for (k, v) in &r.metrics {
                if let Some(kind) = k.strip_prefix("adversary_") {
                    let derived = [
                        "sent",
                        "answered",
                        "own_applied",
                        "forged_applied",
                        "device",
                        "notes",
                        "cpu_s",
                    ];
                    if v.is_number() && !derived.contains(&kind) {
                        kinds.insert(kind.to_string(), ());
                    }
                }
            }
        }
    }
    let mut header = vec!["".to_string()];
    header.extend(groups.iter().map(|(t, _)| t.clone()));
    let mut sent = Builder::default();
    sent.push_record(header.clone());
    for kind in kinds.keys() {
        let mut row = vec![kind.clone()];
        for (_, hostile) in &groups {
            row.push(show(med(hostile, &format!("adversary_{kind}")), false));
        }
        sent.push_record(row);
    }
    let mut counted = Builder::default();
    counted.push_record(header);
    for c in SERVER_COUNTERS {
        let mut row = vec![c.to_string()];
        for (_, hostile) in &groups {
            row.push(show(med(hostile, &format!("hostile_server_{c}")), false));
        }
        counted.push_record(row);
    }
    let mut notes = String::new();
    for (t, hostile) in &groups {
        let mut seen: Vec<String> = Vec::new();
        for r in hostile {
            if let Some(list) = r.metrics.get("adversary_notes").and_then(|v| v.as_array()) {
                for n in list.iter().filter_map(|n| n.as_str()) {
                    if !seen.iter().any(|s| s == n) {
                        seen.push(n.to_string());
                    }
                }
            }
        }
        for n in seen {
            notes.push_str(&format!("- {t}: {n}\n"));
        }
    }
    let (mut sent, mut counted) = (sent.build(), counted.build());
    sent.with(Style::markdown());
    counted.with(Style::markdown());
    let mut out = format!(
        "What the adversary sent, by kind (median of rounds):\n\n{sent}\n\n\
         What the server counted, by counter, over all its starts (median of rounds):\n\n{counted}\n\n"
    );
    if !notes.is_empty() {
        out.push_str(&format!("The adversary's notes:\n\n{notes}\n"));
    }
    out
}

/// The invariants of every hostile run: the server answered at the end, nothing applied that was not made (the
/// audit's `unknown`; the adversary's own orders are counted apart), nothing applied in another device's name where
/// the transport authenticates, and the adversary did send and the server did count bad input.
pub fn checks(results: &[RunResult]) -> Vec<Check> {
    let mut out = Vec::new();
    for r in results
        .iter()
        .filter(|r| is_hostile(r) && r.skipped.is_none())
    {
        let name = format!("{} {} round {}", r.workload, label(r), r.round);
        let mut check = |what: &str, key: &str, expected: &str, ok: fn(f64) -> bool| {
            let v = r.metric(key);
            out.push(Check {
                what: format!("{name}: {what}"),
                found: v.map(thousands).unwrap_or_else(|| "missing".into()),
                expected: expected.into(),
                ok: v.is_some_and(ok),
                gated: true,
            });
        };
        check(
            "the server answered at the end",
            "server_answered_end",
            "1",
            |v| v == 1.0,
        );
        check(
            "applied, made by no one known (unknown)",
            "unknown",
            "0",
            |v| v == 0.0,
        );
        check("the adversary sent", "adversary_sent", "> 0", |v| v > 0.0);
        check(
            "bad input the server refused",
            "hostile_server_refused",
            "> 0",
            |v| v > 0.0,
        );
        if r.transport == UNAUTHENTICATED {
            // Nothing authenticates a record: the adversary's records in other devices' names are applied, as
            // designed (docs/security.md). Shown, not failed.
            check(
                "applied in another device's name (pure:plain authenticates nothing)",
                "adversary_forged_applied",
                "any",
                |_| true,
            );
        } else {
            check(
                "applied in another device's name",
                "adversary_forged_applied",
                "0",
                |v| v == 0.0,
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use workloads::result::{Provenance, SCHEMA};

    fn result(transport: &str, hostile: bool, metrics: &[(&str, f64)]) -> RunResult {
        RunResult {
            schema: SCHEMA,
            workload: "restart".into(),
            transport: transport.into(),
            round: 0,
            params: serde_json::json!({ "hostile": hostile }),
            metrics: metrics
                .iter()
                .map(|(k, v)| (k.to_string(), (*v).into()))
                .collect(),
            histograms: Default::default(),
            provenance: Provenance::default(),
            skipped: None,
            durability: None,
            error: None,
        }
    }

    #[test]
    fn a_hostile_run_fails_when_unknown_orders_were_applied_or_the_server_did_not_answer() {
        let good = [
            ("server_answered_end", 1.0),
            ("unknown", 0.0),
            ("adversary_sent", 10.0),
            ("hostile_server_refused", 5.0),
            ("adversary_forged_applied", 0.0),
        ];
        assert!(checks(&[result("pure", true, &good)]).iter().all(|c| c.ok));
        let mut bad = good;
        bad[1].1 = 3.0;
        assert_eq!(
            checks(&[result("pure", true, &bad)])
                .iter()
                .filter(|c| !c.ok)
                .count(),
            1
        );
        // Not probed at the end (a workload that shut its server down itself): a failure, not a pass.
        let unprobed: Vec<_> = good[1..].to_vec();
        assert!(checks(&[result("quinn", true, &unprobed)])
            .iter()
            .any(|c| !c.ok));
        // Forgeries applied: a failure where records are authenticated, shown under pure:plain.
        let mut forged = good;
        forged[4].1 = 4.0;
        assert!(checks(&[result("pure", true, &forged)])
            .iter()
            .any(|c| !c.ok));
        assert!(checks(&[result("pure:plain", true, &forged)])
            .iter()
            .all(|c| c.ok));
        // Clean runs are not checked here.
        assert!(checks(&[result("pure", false, &[])]).is_empty());
    }

    #[test]
    fn the_side_by_side_table_shows_the_ratio_of_the_primary_metric() {
        let rs = [
            result("pure", false, &[("make_to_stored_p99_ms", 10.0)]),
            result(
                "pure",
                true,
                &[
                    ("make_to_stored_p99_ms", 15.0),
                    ("server_answered_end", 1.0),
                    ("adversary_truncated", 300.0),
                    ("hostile_server_refused_malformed", 290.0),
                ],
            ),
        ];
        let t = tables(&rs);
        assert!(t.contains("| 1.50 "), "{t}");
        assert!(t.contains("1 of 1"), "{t}");
        assert!(t.contains("truncated") && t.contains("290"), "{t}");
        assert_eq!(label(&rs[1]), "pure (hostile)");
    }
}
