//! **idle-links**: `links` links opened and held idle for `idle_s` on each transport's keep-alive (seed 002's idle
//! connections): how long opening all of them takes, what each costs the server in memory, and what holding them
//! costs it in CPU.
//!
//! The links are opened by load-generator worker processes ([`crate::worker`]), as many as keep each under the open
//! files a process may hold. A link of a transport with handshakes is open when its handshake is complete; Pure has
//! no connection, so a Pure link is open when the receiver has stored the device's first order and knows the
//! device (memory per *known* link).
//!
//! Memory is read from the serving process (mosquitto's own for `mqtt@mosquitto`, [`ServerProcess::serving_pid`]):
//! its RSS before the first link, and after the links are open and have idled; the growth over the links open is
//! the cost per link. A broker that publishes its own heap figure (mosquitto: `$SYS/broker/heap/current`) is
//! watched by one more plain client ([`Transport::watch_memory`]) and its growth reported the seed's way (value
//! after minus value before the first connection). The in-tree broker publishes only its RSS
//! (`$SYS/broker/memory/used`), which the RSS figure already is, so it has no heap figure.
//!
//! [`ServerProcess::serving_pid`]: crate::process::ControlledProcess::serving_pid
//! [`Transport::watch_memory`]: transport_core::Transport::watch_memory

use crate::harness::{self, Profile, Run, WorkloadError};
use crate::worker::{self, FirstOrder, Totals, Workers};
use crate::workload::{Better, Column, Format, Info, Metric, Sweep, Workload};
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use transport_core::procfs::{cpu_time, files_limit, open_files, rss_bytes};
use transport_core::{BoxFuture, MemorySource};

/// The idle-links workload's parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IdleLinksParams {
    /// Links to open and hold.
    pub links: u32,
    /// How long they are held idle.
    pub idle_s: u64,
    /// Links being opened at once, over every worker.
    pub concurrency: u32,
    /// The most links one worker process runs (one open file each).
    pub max_links_per_worker: u32,
    /// Give up opening links after this long.
    pub open_timeout_s: u64,
    /// Bytes of payload of Pure's first order.
    pub payload_bytes: u32,
}

/// The link counts of seed 002's idle-connections table.
pub const SEED_LINKS: [u32; 3] = [5_000, 10_000, 20_000];

/// How long the server is left alone before its memory is read the first time, and how long a broker's `$SYS`
/// figure may take to show the last change (mosquitto publishes every second here).
const SETTLE: Duration = Duration::from_secs(3);
/// How often the workers are asked how far they are.
const POLL: Duration = Duration::from_millis(250);
/// How often progress is printed while links open.
const PROGRESS: Duration = Duration::from_secs(5);

/// The idle-links workload.
#[derive(Debug, Clone, Copy)]
pub struct IdleLinks;

const INFO: Info = Info {
    name: "idle-links",
    about: "many links opened and held idle on each transport's keep-alive: time to open, server memory per link, \
            server CPU while idle",
    needs: &[],
    metrics: &[
        Metric {
            key: "open_s",
            unit: "s",
            about: "from the first link asked for to the last one open (all workers)",
        },
        Metric {
            key: "opened",
            unit: "count",
            about: "links open when opening ended",
        },
        Metric {
            key: "errors",
            unit: "count",
            about: "links that failed to open, and links lost while idle (by kind in error_kinds)",
        },
        Metric {
            key: "error_kinds",
            unit: "count per kind",
            about: "errors by kind, each with the first one's message (error_examples)",
        },
        Metric {
            key: "lost_idle",
            unit: "count",
            about: "links that closed on their own while held idle (also counted in errors)",
        },
        Metric {
            key: "idle_s",
            unit: "s",
            about: "the idle window as measured",
        },
        Metric {
            key: "server_rss_before_bytes",
            unit: "bytes",
            about: "the serving process's RSS before the first link",
        },
        Metric {
            key: "server_rss_after_bytes",
            unit: "bytes",
            about: "its RSS after opening and idling",
        },
        Metric {
            key: "server_rss_kib_per_link",
            unit: "KiB/link",
            about: "(RSS after - RSS before) / links open, in KiB (1,024 bytes)",
        },
        Metric {
            key: "broker_heap_before_bytes",
            unit: "bytes",
            about: "the broker's own heap figure ($SYS) before the first link (brokers that publish one)",
        },
        Metric {
            key: "broker_heap_after_bytes",
            unit: "bytes",
            about: "the same after opening and idling",
        },
        Metric {
            key: "broker_heap_kib_per_link",
            unit: "KiB/link",
            about: "(heap after - heap before) / links open, in KiB: seed 002's figure",
        },
        Metric {
            key: "server_files",
            unit: "count",
            about: "the files the serving process held open after idling (a TCP server: one per connection)",
        },
        Metric {
            key: "server_files_limit",
            unit: "count",
            about: "the files it may hold (its soft limit): a server at its limit refuses more connections",
        },
        Metric {
            key: "server_cpu_ms_per_s",
            unit: "ms/s",
            about: "the serving process's CPU over the idle window / its length",
        },
        Metric {
            key: "client_cpu_ms_per_s",
            unit: "ms/s",
            about: "every worker's CPU over the idle window / its length",
        },
        Metric {
            key: "workers",
            unit: "count",
            about: "load-generator worker processes",
        },
        Metric {
            key: "worker_files_max",
            unit: "count",
            about: "the most open files one worker held with its links open",
        },
        Metric {
            key: "client_handshakes",
            unit: "count",
            about: "handshakes the workers completed",
        },
        Metric {
            key: "client_reconnects",
            unit: "count",
            about: "links the workers opened again after losing them",
        },
        Metric {
            key: "timed_out",
            unit: "0/1",
            about: "1 if not every link was open or failed within open_timeout_s",
        },
    ],
    columns: &[
        Column::new("links", "opened", Format::Count),
        Column::new("open, s", "open_s", Format::Decimal).lower(),
        Column::new("errors", "errors", Format::Sum).lower(),
        Column::new("server RSS KiB/link", "server_rss_kib_per_link", Format::Decimal).lower(),
        Column::new("broker heap KiB/link", "broker_heap_kib_per_link", Format::Decimal).lower(),
        Column::new("server CPU ms/s idle", "server_cpu_ms_per_s", Format::Decimal).lower(),
        Column::new("client CPU ms/s idle", "client_cpu_ms_per_s", Format::Decimal).lower(),
        Column::new("workers", "workers", Format::Count),
    ],
    primary: ("server_rss_kib_per_link", Better::Lower),
    case_keys: &["links"],
    sweep: Some(Sweep {
        key: "links",
        header: "links",
        shared: &[],
        per_transport: &[
            Column::new("open, s", "open_s", Format::Decimal).lower(),
            Column::new("RSS KiB/link", "server_rss_kib_per_link", Format::Decimal).lower(),
            Column::new("heap KiB/link", "broker_heap_kib_per_link", Format::Decimal).lower(),
            Column::new("CPU ms/s idle", "server_cpu_ms_per_s", Format::Decimal).lower(),
            Column::new("errors", "errors", Format::Sum).lower(),
        ],
    }),
};

impl Workload for IdleLinks {
    type Params = IdleLinksParams;

    fn info(&self) -> &'static Info {
        &INFO
    }

    /// Seed 002's 5,000, 10,000 and 20,000 links held a minute, or 500 and 1,000 held a few seconds.
    fn cases(&self, profile: Profile) -> Vec<IdleLinksParams> {
        let (links, idle_s, open_timeout_s): (&[u32], _, _) = match profile {
            Profile::Seed => (&SEED_LINKS, 60, 300),
            Profile::Quick => (&[500, 1_000], 3, 60),
        };
        links
            .iter()
            .map(|&links| IdleLinksParams {
                links,
                idle_s,
                concurrency: 256,
                max_links_per_worker: worker::MAX_LINKS_PER_WORKER,
                open_timeout_s,
                payload_bytes: 64,
            })
            .collect()
    }

    fn check(&self, p: &IdleLinksParams) -> Result<(), String> {
        if p.links == 0 || p.concurrency == 0 || p.idle_s == 0 || p.open_timeout_s == 0 {
            return Err("links, concurrency, idle_s and open_timeout_s must be at least 1".into());
        }
        if !(1..=worker::MAX_LINKS_PER_WORKER).contains(&p.max_links_per_worker) {
            return Err(format!(
                "max_links_per_worker must be between 1 and {} (one open file per link, within the {} a process \
                 may hold in this suite)",
                worker::MAX_LINKS_PER_WORKER,
                worker::FILES_PER_PROCESS
            ));
        }
        Ok(())
    }

    fn run<'a>(
        &'a self,
        run: &'a mut Run<'_>,
        params: &'a IdleLinksParams,
    ) -> BoxFuture<'a, Result<(), WorkloadError>> {
        Box::pin(idle_links(run, params))
    }
}

/// The latest value of a broker's memory figure; an error if its watch has ended or never had one.
fn latest(heap: &watch::Receiver<Option<u64>>, topic: &str) -> Result<u64, WorkloadError> {
    if heap.has_changed().is_err() {
        return Err(WorkloadError::Stats(format!("{topic}: the watch ended")));
    }
    heap.borrow()
        .ok_or_else(|| WorkloadError::Stats(format!("{topic}: no value received")))
}

fn per_link_kib(before: u64, after: u64, links: u64) -> f64 {
    (after as f64 - before as f64) / 1024.0 / links.max(1) as f64
}

async fn idle_links(run: &mut Run<'_>, p: &IdleLinksParams) -> Result<(), WorkloadError> {
    let caps = run.capabilities();
    let topic = match caps.memory {
        MemorySource::RssAndSysTopic(topic) => Some(topic),
        MemorySource::Rss => None,
    };
    // One more device for the plain client that watches the broker's own figure, used by no link.
    let observer = p.links;
    run.prepare(p.links + u32::from(topic.is_some()))?;
    let addr = run.start_server().await?;
    let pid = run.server()?.serving_pid();
    let slices = worker::split(p.links, p.max_links_per_worker);
    let mut workers = Workers::start(
        &run.harness.runner,
        run.spec(),
        &run.dirs.identity,
        addr,
        &slices,
    )
    .await?;
    run.say(&format!(
        "{} links over {} worker process(es), pids {:?}",
        p.links,
        workers.len(),
        workers.pids()
    ));
    let heap = match topic {
        Some(_) => Some(
            run.transport
                .watch_memory(addr, run.dirs.identity.clone(), observer)
                .await?,
        ),
        None => None,
    };

    // The server, left alone, before the first link.
    tokio::time::sleep(SETTLE).await;
    let rss_before = rss_bytes(pid)?;
    let heap_before = match (&heap, topic) {
        (Some(h), Some(t)) => Some(latest(h, t)?),
        _ => None,
    };

    // A transport without connections opens a link with the device's first order (stored: the server knows it).
    let first_order = (!caps.handshakes.is_yes()).then(|| FirstOrder {
        run: harness::new_run(),
        payload_bytes: p.payload_bytes,
    });
    let timeout = Duration::from_secs(p.open_timeout_s);
    workers.connect(p.concurrency, first_order, timeout).await?;
    let deadline = Instant::now() + timeout;
    let mut said = Instant::now();
    let (opening, settled) = workers
        .wait_settled(deadline, POLL, |t| {
            if said.elapsed() >= PROGRESS {
                said = Instant::now();
                run.say(&format!(
                    "{} of {} links open, {} failed",
                    t.opened, t.requested, t.failed
                ));
            }
        })
        .await?;
    let opened = Totals::of(&opening);

    // Idle: nothing happens but each transport's keep-alive.
    let held = Totals::of(&workers.hold().await?);
    let (t0, cpu0) = (Instant::now(), cpu_time(pid)?);
    tokio::time::sleep(Duration::from_secs(p.idle_s)).await;
    let (cpu1, idle) = (cpu_time(pid)?, t0.elapsed());
    let after = Totals::of(&workers.stats().await?);
    let rss_after = rss_bytes(pid)?;
    let (files, files_limit) = (open_files(pid)?, files_limit(pid)?);
    let heap_after = match (&heap, topic) {
        (Some(h), Some(t)) => Some(latest(h, t)?),
        _ => None,
    };
    drop(heap);
    let closed = Totals::of(&workers.close().await?);
    workers.shutdown().await;
    run.server()?.shutdown().await?;
    if let Some(first) = first_order {
        // Every device's first order was made; those of the links that opened were answered "stored".
        let not_open: std::collections::HashSet<u32> =
            closed.not_open_devices.iter().copied().collect();
        let made = worker::first_order_ids(p.links, first.run);
        let acked: Vec<_> = (0..p.links)
            .filter(|d| !not_open.contains(d))
            .map(|d| made[d as usize])
            .collect();
        run.audit(&made, &acked)?;
    }

    // A link lost while idle is opened again by its fleet (and counted as an error): every opened link is held.
    let open_links = after.opened;
    let idle_s = idle.as_secs_f64();
    run.metric("links", p.links);
    run.metric("workers", slices.len());
    run.metric("opened", opened.opened);
    if opened.last_open_us > 0 {
        run.metric(
            "open_s",
            opened.last_open_us.saturating_sub(opened.started_us) as f64 / 1e6,
        );
    }
    run.metric("timed_out", u64::from(!settled));
    let mut kinds = serde_json::Map::new();
    let mut examples = serde_json::Map::new();
    for (kind, e) in &after.errors {
        kinds.insert(kind.clone(), e.count.into());
        examples.insert(kind.clone(), e.example.clone().into());
    }
    // Links the workers had neither opened nor given up on by the end of the idle window are errors too (a
    // worker gives up on its own at the deadline, so these are normally none).
    let pending = after.requested.saturating_sub(after.opened + after.failed);
    if pending > 0 {
        kinds.insert("not open by the deadline".into(), pending.into());
        examples.insert(
            "not open by the deadline".into(),
            format!(
                "neither open nor failed after open_timeout_s = {}",
                p.open_timeout_s
            )
            .into(),
        );
    }
    run.metric("errors", after.errors() + pending);
    run.metric("error_kinds", kinds);
    run.metric("error_examples", examples);
    run.metric("lost_idle", after.lost_holding);
    run.metric("idle_s", idle_s);
    run.metric("server_rss_before_bytes", rss_before);
    run.metric("server_rss_after_bytes", rss_after);
    run.metric(
        "server_rss_kib_per_link",
        per_link_kib(rss_before, rss_after, open_links),
    );
    if let (Some(before), Some(after)) = (heap_before, heap_after) {
        run.metric("broker_heap_before_bytes", before);
        run.metric("broker_heap_after_bytes", after);
        run.metric(
            "broker_heap_kib_per_link",
            per_link_kib(before, after, open_links),
        );
    }
    run.metric(
        "server_cpu_ms_per_s",
        cpu1.saturating_sub(cpu0).as_secs_f64() * 1e3 / idle_s,
    );
    run.metric(
        "client_cpu_ms_per_s",
        (after.cpu_s - held.cpu_s).max(0.0) * 1e3 / idle_s,
    );
    run.metric("worker_files_max", after.files_max);
    run.metric("server_files", files);
    run.metric("server_files_limit", files_limit);
    // Every counter of the workers (client_handshakes, client_reconnects, client_asym_ops, ...).
    run.counters("client_", &after.counters);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growth_per_link_is_in_kib_and_may_be_negative() {
        assert_eq!(per_link_kib(1 << 20, 2 << 20, 1024), 1.0);
        assert_eq!(per_link_kib(2048, 1024, 1), -1.0);
        assert_eq!(per_link_kib(0, 1024, 0), 1.0, "no links: per link of one");
    }

    #[test]
    fn profiles_and_bad_parameters() {
        let seed = IdleLinks.cases(Profile::Seed);
        let links: Vec<u32> = seed.iter().map(|c| c.links).collect();
        assert_eq!(links, SEED_LINKS);
        assert!(seed.iter().all(|c| c.idle_s == 60));
        for c in IdleLinks.cases(Profile::Quick) {
            assert!(IdleLinks.check(&c).is_ok());
            assert!(c.links <= 1_000 && c.idle_s <= 5);
        }
        let mut bad = seed[0].clone();
        bad.max_links_per_worker = worker::MAX_LINKS_PER_WORKER + 1;
        assert!(IdleLinks
            .check(&bad)
            .unwrap_err()
            .contains("max_links_per_worker"));
        bad.max_links_per_worker = 10;
        bad.links = 0;
        assert!(IdleLinks.check(&bad).is_err());
    }
}
