//! When a result's numbers cannot be trusted, and why: one rule, shown in the tables (`runner report`) and failed by
//! `runner check`.
//!
//! A result is not to be trusted when the run failed (its error), when it timed out or left orders unanswered, when
//! fewer orders were acknowledged than made, when the store lost an acknowledged order or applied one twice, when
//! the load generator was the limit (`generator_bound`, see [`crate::lag`]; for a restart also when it was busy
//! through the 10 s after the restart, the window its reconnect columns measure; for publish/subscribe when its own
//! sockets dropped datagrams that messages were lost in), when the store synced on a memory
//! filesystem (a sync there is free and proves nothing, see [`crate::durability`]), when it asked for TCP Fast Open
//! and a server refused the data of a SYN (`fast_open_refused`: its numbers are those of the full handshake), or when
//! its durability is not on record (results of older versions), or when a drain's server was not saturated
//! ([`SERVER_UNSATURATED`]: the drain's rate is the server's own only while the server never waits for the devices).

use crate::result::RunResult;

/// The flag of a run bound by its load generator.
pub const GENERATOR_BOUND: &str = "generator-bound";

/// The flag of a drain whose server waited for the devices: neither it nor its load generator was the limit.
pub const SERVER_UNSATURATED: &str = "server not saturated";

/// A drain's server is saturated when its CPU over the steady part, plus the time it could have run but had no CPU
/// (`server_cpu_wait`) and the time the hypervisor took the machine's CPUs (`host_steal`), is at least this
/// fraction of the steady part. Below it the server waited for work: the rate is that of the round trips between
/// the devices and the server (a latency-bound window, the two sides passing work back and forth in turn), not the
/// server's capacity. Saturated drains here run 0.85-1.00 busy; a QUIC transport whose fleet moved in waves ran
/// 0.6-0.75 (docs/performance.md, "s2n-quic's fleet and server in waves").
pub const SATURATED: f64 = 0.8;

/// Why `r`'s numbers cannot be trusted; empty when nothing says so. A skipped result has no numbers and no flags.
pub fn flags(r: &RunResult) -> Vec<String> {
    let mut out = Vec::new();
    if r.skipped.is_some() {
        return out;
    }
    if let Some(e) = &r.error {
        out.push(format!("error: {e}"));
    }
    let nonzero = |key: &str| r.metric(key).filter(|&v| v != 0.0);
    if nonzero("timed_out").is_some() {
        out.push("timed out".into());
    }
    for (key, what) in [
        ("unanswered", "unanswered"),
        ("lost", "made, not in the log"),
        ("duplicates", "applied twice"),
        ("acked_not_applied", "acknowledged, not in the log"),
        ("errors", "errors"),
        ("undelivered", "undelivered"),
        (
            "fast_open_refused",
            "connections whose SYN data the server did not take (TCP Fast Open asked for)",
        ),
    ] {
        if let Some(v) = nonzero(key) {
            out.push(format!("{v} {what}"));
        }
    }
    if let (Some(made), Some(acked)) = (r.metric("orders_made"), r.metric("orders_acked")) {
        if made != acked {
            out.push(format!("{acked} of {made} orders acknowledged"));
        }
    }
    if nonzero("generator_bound").is_some() {
        out.push(GENERATOR_BOUND.into());
    } else if let (Some(_), Some(drops)) = (
        nonzero("lost_in_sockets"),
        nonzero("generator_socket_drops"),
    ) {
        // Messages lost in the generator's own sockets: it did not read its subscribers' datagrams in time.
        out.push(format!(
            "{GENERATOR_BOUND}: its sockets dropped {drops} datagrams"
        ));
    } else if let Some(busy) = busy_after_restart(r) {
        // A restart is judged where it matters too: the reconnect storm in the 10 s after the restart, which its
        // "after" columns measure, can saturate the generator while its average over the whole run stays low.
        if busy >= crate::lag::BUSY_LIMIT {
            out.push(format!(
                "{GENERATOR_BOUND} after the restart (busy {:.0}% of {} CPU(s) in the {} s after it)",
                busy * 100.0,
                r.provenance.pinning.generator_cpu_count(),
                crate::restart::AFTER.as_secs()
            ));
        }
    } else if let Some(why) = unsaturated(r) {
        // Neither generator-bound nor fed: a drain's server that waited for the devices.
        out.push(why);
    }
    match &r.durability {
        Some(d) if d.volatile_sync() => {
            out.push(format!("sync {} on {}: not durability", d.sync, d.store_fs))
        }
        Some(_) => {}
        // A failed run says why already; any other run reads its server's store statistics at the end.
        None if r.error.is_none() => out.push("durability not on record".into()),
        None => {}
    }
    out
}

/// Why a drain's server was not saturated ([`SATURATED`]); `None` for other workloads and for a drain that did not
/// measure the server's CPU. [`flags`] asks only when the load generator was not the limit (a server fed too slowly
/// waits for that reason, already named).
fn unsaturated(r: &RunResult) -> Option<String> {
    if r.workload != "drain" {
        return None;
    }
    let busy = r.metric("server_busy")?;
    let wait = r.metric("server_cpu_wait").unwrap_or(0.0);
    let steal = r.metric("host_steal").unwrap_or(0.0);
    (busy + wait + steal < SATURATED).then(|| {
        format!(
            "{SERVER_UNSATURATED} (busy {:.0}%, short of its CPU {:.0}%)",
            busy * 100.0,
            wait * 100.0
        )
    })
}

/// The fraction of its CPUs a restart's load generator used in the window after the restart.
fn busy_after_restart(r: &RunResult) -> Option<f64> {
    if r.workload != "restart" {
        return None;
    }
    let cpu = r.metric("client_cpu_s_after")?;
    let cpus = r.provenance.pinning.generator_cpu_count().max(1) as f64;
    Some(cpu / crate::restart::AFTER.as_secs_f64() / cpus)
}

/// Whether nothing says `r`'s numbers cannot be trusted.
pub fn trusted(r: &RunResult) -> bool {
    flags(r).is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::durability::Durability;

    fn result(metrics: &[(&str, f64)]) -> RunResult {
        let durability = Some(Durability {
            sync: "batch".into(),
            store_fs: "ext4".into(),
            ..Durability::default()
        });
        RunResult {
            schema: crate::result::SCHEMA,
            workload: "drain".into(),
            transport: "pure".into(),
            round: 0,
            params: serde_json::json!({}),
            metrics: metrics
                .iter()
                .map(|(k, v)| (k.to_string(), (*v).into()))
                .collect(),
            histograms: Default::default(),
            provenance: Default::default(),
            skipped: None,
            durability,
            error: None,
        }
    }

    #[test]
    fn each_reason_is_named() {
        assert!(trusted(&result(&[("lost", 0.0), ("generator_bound", 0.0)])));
        let bad = result(&[
            ("timed_out", 1.0),
            ("unanswered", 3.0),
            ("orders_made", 10.0),
            ("orders_acked", 7.0),
            ("generator_bound", 1.0),
        ]);
        let f = flags(&bad).join("; ");
        for want in ["timed out", "3 unanswered", "7 of 10", "generator-bound"] {
            assert!(f.contains(want), "{f}");
        }
        let mut tmpfs = result(&[]);
        tmpfs.durability = Some(Durability {
            sync: "batch".into(),
            store_fs: "tmpfs".into(),
            ..Durability::default()
        });
        assert!(flags(&tmpfs)[0].contains("tmpfs"));
        tmpfs.durability.as_mut().unwrap().sync = "none".into();
        assert!(trusted(&tmpfs), "no sync asked, none promised");
        tmpfs.durability = None;
        assert_eq!(flags(&tmpfs), vec!["durability not on record".to_string()]);
        let mut failed = result(&[]);
        failed.error = Some("server statistics: missing field".into());
        assert!(flags(&failed)[0].starts_with("error: "));
        failed.skipped = Some("n/a".into());
        assert!(trusted(&failed));
    }

    #[test]
    fn a_drain_whose_server_waited_for_the_devices_is_named() {
        // Two-thirds busy, never short of its CPU: the two sides passed the work back and forth.
        let waves = result(&[
            ("server_busy", 0.64),
            ("server_cpu_wait", 0.0),
            ("host_steal", 0.0),
            ("generator_bound", 0.0),
        ]);
        let f = flags(&waves);
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(f[0].starts_with(SERVER_UNSATURATED), "{f:?}");
        assert!(f[0].contains("busy 64%"), "{f:?}");
        // Saturated, or short of its CPU rather than of work (another process, the hypervisor): trusted.
        for metrics in [
            [
                ("server_busy", 0.93),
                ("server_cpu_wait", 0.0),
                ("host_steal", 0.0),
            ],
            [
                ("server_busy", 0.4),
                ("server_cpu_wait", 0.45),
                ("host_steal", 0.0),
            ],
            [
                ("server_busy", 0.6),
                ("server_cpu_wait", 0.0),
                ("host_steal", 0.25),
            ],
        ] {
            assert!(trusted(&result(&metrics)), "{metrics:?}");
        }
        // Just under the line: named.
        assert!(!trusted(&result(&[("server_busy", 0.79)])));
        // A generator-bound drain is named for that alone; a drain too short to measure, and other workloads, never.
        let bound = result(&[("server_busy", 0.5), ("generator_bound", 1.0)]);
        assert_eq!(flags(&bound), vec![GENERATOR_BOUND.to_string()]);
        assert!(trusted(&result(&[("orders", 10.0)])));
        let mut restart = waves.clone();
        restart.workload = "restart".into();
        assert!(trusted(&restart));
    }

    #[test]
    fn tcp_fast_open_asked_for_and_refused_is_a_doubt() {
        assert!(trusted(&result(&[
            ("fast_open", 100.0),
            ("fast_open_refused", 0.0)
        ])));
        let f = flags(&result(&[("fast_open", 0.0), ("fast_open_refused", 20.0)]));
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(f[0].starts_with("20 connections whose SYN data"), "{f:?}");
    }

    #[test]
    fn messages_lost_in_the_generators_own_sockets_make_a_run_generator_bound() {
        let r = result(&[
            ("lost_in_sockets", 40.0),
            ("server_socket_drops", 3.0),
            ("generator_socket_drops", 5.0),
        ]);
        let f = flags(&r);
        assert_eq!(
            f,
            vec!["generator-bound: its sockets dropped 5 datagrams".to_string()]
        );
        // Lost in the server's socket only: the transport's own loss at QoS 0, shown in its column, not a doubt.
        assert!(trusted(&result(&[
            ("lost_in_sockets", 40.0),
            ("server_socket_drops", 3.0),
            ("generator_socket_drops", 0.0),
        ])));
    }

    #[test]
    fn a_restart_whose_generator_was_busy_after_the_restart_is_generator_bound() {
        let mut r = result(&[("client_cpu_s_after", 9.8), ("generator_bound", 0.0)]);
        r.workload = "restart".into();
        r.provenance.pinning.generator_cpus = vec![1];
        let f = flags(&r);
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(
            f[0].starts_with(GENERATOR_BOUND) && f[0].contains("98%"),
            "{f:?}"
        );
        // Half as busy: trusted. Two CPUs for the generator: the same CPU time is half of what it had.
        r.metrics.insert("client_cpu_s_after".into(), 4.9.into());
        assert!(trusted(&r));
        r.metrics.insert("client_cpu_s_after".into(), 9.8.into());
        r.provenance.pinning.generator_cpus = vec![1, 2];
        assert!(trusted(&r));
        // Other workloads have no such window.
        r.workload = "drain".into();
        r.provenance.pinning.generator_cpus = vec![1];
        assert!(trusted(&r));
    }
}
