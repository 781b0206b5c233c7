//! What the publish/subscribe workloads share ([`crate::fanout`], [`crate::flood`], [`crate::moderate_rate`]): one
//! run of publishers and subscribers through a server's relay ([`run`]), its accounting and its metrics.
//!
//! # One run
//!
//! Devices `0..P` publish, device `p` on channel `publishers[p]`; devices `P..P+S` subscribe, each to its channel of
//! `subscribers`, at the run's QoS. Every link is opened and every subscription confirmed before the load starts.
//! Then, for `duration_s`, the publishers hand messages to their links ([`Pace`]): at a set rate, open loop, each
//! message with an intended time (latency counts from it, so a late publisher shows as latency), or as fast as
//! the link accepts them, each publisher with at most `window` messages handed over and not yet accepted. Then
//! the drain: the run waits until every message is accounted for, or `drain_timeout_s` passes.
//!
//! # Accounting (one definition for every transport)
//!
//! - `published`: messages handed to the publishers' links; `accepted`: of those, reported accepted (QoS 1: the
//!   server acknowledged them; QoS 0: written to the connection).
//! - `expected`: the sum over published messages of the number of subscribers of the message's channel (fanout:
//!   published × subscribers; flood: published).
//! - `delivered`: (subscriber, message) pairs reported delivered; a second report of a pair, or a report of a pair
//!   not expected, is a `duplicate` and is not counted as delivered.
//! - `dropped`: what the server says it dropped, from its own counter over the run (the in-tree broker's and the
//!   QUIC relay's `dropped`; mosquitto's `$SYS/broker/publish/messages/dropped`).
//! - `lost_in_sockets`: at QoS 0, what the kernel dropped on the way: the datagrams the server's and the load
//!   generator's UDP sockets dropped during the run (`server_socket_drops`, `generator_socket_drops`, from
//!   `/proc/PID/net/udp`) account for as many missing messages as they could have carried
//!   ([`MESSAGES_PER_DATAGRAM`]); never more than are missing. At QoS 1 a lost datagram is sent again, so it is 0.
//! - `undelivered`: what is left, `expected − delivered − dropped − lost_in_sockets` (at least 0), when the drain
//!   ends.
//!
//! `expected = delivered + dropped + lost_in_sockets + undelivered` holds unless the server counted more than it
//! failed to deliver, and `runner check` fails a run where it does not hold, where `undelivered > 0` or where
//! `duplicates > 0`: nothing may go missing without a count. Messages lost in the generator's own sockets mark the
//! run generator-bound: it did not read its subscribers' datagrams in time. One clock: publish and delivery times are `Instant`s of this process (the
//! links stamp a delivery when they read it).

use crate::harness::{Run, WorkloadError};
use crate::hist;
use crate::sample::{self, Sampler};
use crate::workload::Metric;
use futures::stream::{self, StreamExt, TryStreamExt};
use hdrhistogram::Histogram;
use std::time::{Duration, Instant};
use transport_core::{LinkEvent, Publish, QoS};

/// The largest datagram any UDP transport here sends (Pure's 1,200 bytes, QUIC's at most 1,472 on loopback or
/// Ethernet): a dropped datagram carried at most this many bytes of messages.
pub const LARGEST_DATAGRAM: u64 = 1_500;

/// How many messages of `payload_bytes` one dropped datagram can have carried, at most.
pub fn messages_per_datagram(payload_bytes: u32) -> u64 {
    (LARGEST_DATAGRAM / u64::from(payload_bytes).max(1)).max(1)
}

/// Datagrams process `pid`'s UDP sockets have dropped so far (0 if it cannot be read: a TCP-only server has none).
fn udp_drops(pid: u32) -> u64 {
    transport_core::procfs::udp_drops(pid).unwrap_or(0)
}

/// How publishers hand messages over.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pace {
    /// Each publisher `per_s` messages per second, open loop: message `s` of publisher `p` is intended for
    /// `start + (p/P + s) / per_s` and handed over then.
    Rate {
        /// Messages per second per publisher.
        per_s: f64,
    },
    /// Each publisher as fast as its link accepts: at most `window` messages handed over and not yet accepted.
    /// A message's intended time is when it was handed over.
    Window {
        /// Messages per publisher handed over and not yet accepted.
        window: u32,
    },
}

/// One run's shape.
#[derive(Debug, Clone)]
pub struct Load {
    /// The channel of each publisher (devices `0..`).
    pub publishers: Vec<u32>,
    /// The channel of each subscriber (devices numbered after the publishers).
    pub subscribers: Vec<u32>,
    /// The QoS of publishing and subscribing.
    pub qos: QoS,
    /// Payload bytes per message (at least the 8 of its id).
    pub payload_bytes: u32,
    /// How publishers hand messages over.
    pub pace: Pace,
    /// How long publishers hand messages over.
    pub duration: Duration,
    /// After the load, how long to wait for every message to be accounted for.
    pub drain_timeout: Duration,
}

/// The QoS of a parameter (0 or 1).
pub fn qos(level: u8) -> Result<QoS, String> {
    match level {
        0 => Ok(QoS::AtMostOnce),
        1 => Ok(QoS::AtLeastOnce),
        other => Err(format!("qos {other}: must be 0 or 1")),
    }
}

/// The metrics of the publish/subscribe workloads: the case (fanout: `subscribers`; flood and moderate-rate:
/// `pairs`, `payload_bytes`; all: `qos`, `rate_per_s`), then what every run records.
pub const METRICS: &[Metric] = &[
    Metric {
        key: "subscribers",
        unit: "count",
        about: "fanout: subscribers of the channel",
    },
    Metric {
        key: "pairs",
        unit: "count",
        about: "flood: publisher/subscriber pairs",
    },
    Metric {
        key: "qos",
        unit: "0/1",
        about: "QoS of publishing and subscribing",
    },
    Metric {
        key: "payload_bytes",
        unit: "B",
        about: "payload per message",
    },
    Metric {
        key: "rate_per_s",
        unit: "msg/s",
        about: "per publisher, open loop; 0: as fast as accepted",
    },
    Metric {
        key: "published",
        unit: "count",
        about: "messages handed to the publishers' links",
    },
    Metric {
        key: "accepted",
        unit: "count",
        about: "of those, accepted (QoS 1: acknowledged by the server; QoS 0: written)",
    },
    Metric {
        key: "expected",
        unit: "count",
        about: "published messages × the subscribers of their channel",
    },
    Metric {
        key: "delivered",
        unit: "count",
        about: "(subscriber, message) pairs delivered, each counted once",
    },
    Metric {
        key: "dropped",
        unit: "count",
        about: "messages the server dropped by back-pressure, from its own counter",
    },
    Metric {
        key: "lost_in_sockets",
        unit: "count",
        about: "QoS 0: missing messages the kernel's UDP socket drops during the run account for",
    },
    Metric {
        key: "server_socket_drops",
        unit: "datagrams",
        about: "datagrams the server's UDP sockets dropped during the run (receive buffer full)",
    },
    Metric {
        key: "generator_socket_drops",
        unit: "datagrams",
        about: "datagrams the load generator's UDP sockets dropped during the run (receive buffer full)",
    },
    Metric {
        key: "undelivered",
        unit: "count",
        about: "expected − delivered − dropped − lost_in_sockets when the drain ended: missing without a count",
    },
    Metric {
        key: "duplicates",
        unit: "count",
        about: "deliveries reported twice to one subscriber, or not expected",
    },
    Metric {
        key: "published_per_s",
        unit: "msg/s",
        about: "messages accepted during the load / its duration",
    },
    Metric {
        key: "expected_per_s",
        unit: "msg/s",
        about: "expected deliveries / the load's duration",
    },
    Metric {
        key: "delivered_per_s",
        unit: "msg/s",
        about: "deliveries during the load / its duration",
    },
    Metric {
        key: "p50_ms",
        unit: "ms",
        about: "median publish-to-delivered latency, from each message's intended time",
    },
    Metric {
        key: "p99_ms",
        unit: "ms",
        about: "99th percentile of the same",
    },
    Metric {
        key: "max_ms",
        unit: "ms",
        about: "the largest (an undelivered message counts at the drain's end)",
    },
    Metric {
        key: "publish_lag_p99_ms",
        unit: "ms",
        about: "open loop: 99th percentile of how late a message was handed over",
    },
    Metric {
        key: "connections_lost",
        unit: "count",
        about: "links lost without being asked to close (LinkEvent::Lost)",
    },
    Metric {
        key: "server_cpu_s",
        unit: "s",
        about: "the serving process's CPU over the load (/proc samples)",
    },
    Metric {
        key: "server_cpu_pct",
        unit: "% of a core",
        about: "server_cpu_s / the load's duration",
    },
    Metric {
        key: "client_cpu_s",
        unit: "s",
        about: "the load generator's CPU over the load",
    },
    Metric {
        key: "server_rss_max_mib",
        unit: "MiB",
        about: "the serving process's largest resident set during the run",
    },
    Metric {
        key: "server_rss_per_link_kib",
        unit: "KiB",
        about: "(largest RSS − RSS before the links opened) / links",
    },
];

/// How often the server's counters are read while waiting for the drain.
const POLL: Duration = Duration::from_millis(250);
/// How often the serving process's CPU and memory are sampled.
const SAMPLE: Duration = Duration::from_millis(100);
/// Links opened and subscriptions made at once.
const CONCURRENT: usize = 256;

/// What is known of the run's messages and deliveries.
struct Tally {
    load: Load,
    start: Instant,
    end: Instant,
    /// Per publisher: messages handed over, and their intended times (µs from `start`) in window mode.
    handed: Vec<u64>,
    handed_at: Vec<Vec<u32>>,
    /// Per publisher: handed over and not yet accepted.
    outstanding: Vec<u32>,
    accepted: u64,
    accepted_in_load: u64,
    /// Per (subscriber, publisher) on the same channel: which messages were delivered.
    seen: Vec<Vec<u64>>,
    /// Per channel: how many subscribers it has.
    fans: std::collections::HashMap<u32, u64>,
    expected: u64,
    delivered: u64,
    delivered_in_load: u64,
    duplicates: u64,
    lost: u64,
    latency: Histogram<u64>,
    lag: Histogram<u64>,
}

impl Tally {
    fn new(load: &Load, start: Instant) -> Tally {
        let p = load.publishers.len();
        let mut fans = std::collections::HashMap::new();
        for &c in &load.subscribers {
            *fans.entry(c).or_insert(0u64) += 1;
        }
        Tally {
            load: load.clone(),
            start,
            end: start + load.duration,
            handed: vec![0; p],
            handed_at: vec![Vec::new(); p],
            outstanding: vec![0; p],
            accepted: 0,
            accepted_in_load: 0,
            seen: vec![Vec::new(); p * load.subscribers.len()],
            fans,
            expected: 0,
            delivered: 0,
            delivered_in_load: 0,
            duplicates: 0,
            lost: 0,
            latency: hist::new(),
            lag: hist::new(),
        }
    }

    fn publishers(&self) -> u32 {
        self.load.publishers.len() as u32
    }

    /// When message `seq` of publisher `p` is intended (rate mode).
    fn intended(&self, p: usize, seq: u64, per_s: f64) -> Instant {
        let n = self.load.publishers.len() as f64;
        self.start + Duration::from_secs_f64((p as f64 / n + seq as f64) / per_s)
    }

    /// Hand publisher `p`'s next message to its link; `intended` is its intended time.
    fn publish(
        &mut self,
        f: &dyn transport_core::Fleet,
        p: usize,
        intended: Instant,
        now: Instant,
    ) {
        let seq = self.handed[p];
        self.handed[p] += 1;
        self.outstanding[p] += 1;
        if matches!(self.load.pace, Pace::Window { .. }) {
            let us = now.saturating_duration_since(self.start).as_micros();
            self.handed_at[p].push(us.min(u128::from(u32::MAX)) as u32);
        } else {
            hist::record(&mut self.lag, now.saturating_duration_since(intended));
        }
        let channel = self.load.publishers[p];
        self.expected += self.fans.get(&channel).copied().unwrap_or(0);
        f.publish(
            p as u32,
            Publish {
                channel,
                id: (p as u64) << 32 | seq,
                qos: self.load.qos,
                size: self.load.payload_bytes,
            },
        );
    }

    /// Take one event; returns the publisher that may publish again (window mode), if any.
    fn on(&mut self, event: &LinkEvent) -> Option<usize> {
        match *event {
            LinkEvent::Accepted { device, at, .. } => {
                let p = device as usize;
                let o = self.outstanding.get_mut(p)?;
                *o = o.saturating_sub(1);
                self.accepted += 1;
                if at <= self.end {
                    self.accepted_in_load += 1;
                }
                Some(p)
            }
            LinkEvent::Delivered { device, id, at } => {
                self.delivered(device, id, at);
                None
            }
            LinkEvent::Lost { .. } => {
                self.lost += 1;
                None
            }
            _ => None,
        }
    }

    fn delivered(&mut self, device: u32, id: u64, at: Instant) {
        let (p, seq) = ((id >> 32) as usize, id & 0xffff_ffff);
        let Some(s) = device.checked_sub(self.publishers()).map(|s| s as usize) else {
            self.duplicates += 1;
            return;
        };
        let expected = p < self.load.publishers.len()
            && s < self.load.subscribers.len()
            && self.load.subscribers[s] == self.load.publishers[p]
            && seq < self.handed[p];
        if !expected {
            self.duplicates += 1;
            return;
        }
        let bits = &mut self.seen[s * self.load.publishers.len() + p];
        let (word, bit) = ((seq / 64) as usize, seq % 64);
        if bits.len() <= word {
            bits.resize(word + 1, 0);
        }
        if bits[word] & (1 << bit) != 0 {
            self.duplicates += 1;
            return;
        }
        bits[word] |= 1 << bit;
        self.delivered += 1;
        if at <= self.end {
            self.delivered_in_load += 1;
        }
        let intended = match self.load.pace {
            Pace::Rate { per_s } => self.intended(p, seq, per_s),
            Pace::Window { .. } => {
                self.start + Duration::from_micros(u64::from(self.handed_at[p][seq as usize]))
            }
        };
        hist::record(&mut self.latency, at.saturating_duration_since(intended));
    }
}

/// Run `load` against the run's transport and record every metric of [`METRICS`], its histograms
/// (`publish_to_delivered`, and `publish_lag` in rate mode) and both sides' counters.
pub async fn run(run: &mut Run<'_>, load: &Load) -> Result<(), WorkloadError> {
    let publishers = load.publishers.len() as u32;
    let devices = publishers + load.subscribers.len() as u32;
    run.prepare(devices)?;
    let addr = run.start_server().await?;
    let pid = run.server()?.serving_pid();
    let rss_before = sample::rss_bytes(pid).unwrap_or(0);
    let sampled_from = Instant::now();
    let sampler = Sampler::start(pid, SAMPLE);
    let mut f = run.fleet(addr, devices).await?;
    f.connect_all(devices).await?;
    let fleet = f.fleet.clone();
    let subscriptions: Vec<_> = (0..load.subscribers.len())
        .map(|s| fleet.subscribe(publishers + s as u32, load.subscribers[s], load.qos))
        .collect();
    stream::iter(subscriptions)
        .buffer_unordered(CONCURRENT)
        .try_collect::<Vec<_>>()
        .await?;
    run.say(&format!(
        "{} links open, {} subscribed; publishing for {:?}",
        devices,
        load.subscribers.len(),
        load.duration
    ));
    let before = run.server_stats().await?;
    let client_before = f.counters.snapshot();
    let me = std::process::id();
    let socket_drops_before = (udp_drops(pid), udp_drops(me));

    let mut t = Tally::new(load, Instant::now());
    let mut events = Vec::with_capacity(1024);
    // The load.
    if let Pace::Window { window } = load.pace {
        let now = Instant::now();
        for p in 0..load.publishers.len() {
            for _ in 0..window {
                t.publish(&*fleet, p, now, now);
            }
        }
    }
    loop {
        let now = Instant::now();
        let mut next = t.end;
        if let Pace::Rate { per_s } = load.pace {
            for p in 0..load.publishers.len() {
                loop {
                    let due = t.intended(p, t.handed[p], per_s);
                    if due >= t.end {
                        break;
                    }
                    if due > now {
                        next = next.min(due);
                        break;
                    }
                    t.publish(&*fleet, p, due, now);
                }
            }
        }
        if now >= t.end {
            break;
        }
        tokio::select! {
            n = f.events.recv_many(&mut events, 1024) => {
                if n == 0 {
                    return Err(WorkloadError::Timeout("the fleet stopped".into()));
                }
                let now = Instant::now();
                for e in events.drain(..) {
                    if let (Some(p), Pace::Window { window }) = (t.on(&e), load.pace) {
                        if now < t.end && t.outstanding[p] < window {
                            t.publish(&*fleet, p, now, now);
                        }
                    }
                }
            }
            () = tokio::time::sleep_until(next.into()) => {}
        }
    }
    let load_end = Instant::now();

    // The drain: until every message is accepted and every expected delivery is delivered or counted dropped.
    let published: u64 = t.handed.iter().sum();
    let deadline = load_end + load.drain_timeout;
    let mut dropped = 0;
    let mut poll = tokio::time::interval(POLL);
    loop {
        if t.accepted >= published && t.delivered + dropped >= t.expected {
            break;
        }
        tokio::select! {
            n = f.events.recv_many(&mut events, 1024) => {
                if n == 0 {
                    break;
                }
                for e in events.drain(..) {
                    t.on(&e);
                }
            }
            _ = poll.tick() => {
                let now = run.server_stats().await?;
                dropped = now.counters.dropped.saturating_sub(before.counters.dropped);
            }
            () = tokio::time::sleep_until(deadline.into()) => break,
        }
    }
    while let Ok(e) = f.events.try_recv() {
        t.on(&e);
    }
    let after = run.server_stats().await?;
    let dropped = after
        .counters
        .dropped
        .saturating_sub(before.counters.dropped);
    let client = f.counters.snapshot().since(&client_before);
    // Before the fleet closes: a socket's drop count goes with it.
    let server_socket_drops = udp_drops(pid).saturating_sub(socket_drops_before.0);
    let generator_socket_drops = udp_drops(me).saturating_sub(socket_drops_before.1);
    f.fleet.close().await;
    let samples = sampler.stop().await;
    run.server()?.shutdown().await?;

    let missing = t.expected.saturating_sub(t.delivered + dropped);
    let lost_in_sockets = match load.qos {
        QoS::AtMostOnce => missing.min(
            (server_socket_drops + generator_socket_drops)
                .saturating_mul(messages_per_datagram(load.payload_bytes)),
        ),
        _ => 0,
    };
    let undelivered = missing - lost_in_sockets;
    // A message neither delivered nor counted is never hidden: it counts at the drain's end.
    if undelivered > 0 {
        let waited = Instant::now().saturating_duration_since(load_end) + load.duration;
        let us = (waited.as_micros() as u64).clamp(1, hist::MAX_US);
        let _ = t.latency.record_n(us, undelivered);
    }
    let secs = load.duration.as_secs_f64().max(1e-9);
    let rel = |at: Instant| at.saturating_duration_since(sampled_from).as_millis() as u64;
    let (server_cpu, client_cpu) = sample::cpu_between(&samples, rel(t.start), rel(load_end));
    let rss_max = samples
        .iter()
        .map(|s| s.server_rss_bytes)
        .max()
        .unwrap_or(0);

    run.metric("published", published);
    run.metric("accepted", t.accepted);
    run.metric("expected", t.expected);
    run.metric("delivered", t.delivered);
    run.metric("dropped", dropped);
    run.metric("lost_in_sockets", lost_in_sockets);
    run.metric("server_socket_drops", server_socket_drops);
    run.metric("generator_socket_drops", generator_socket_drops);
    run.metric("undelivered", undelivered);
    run.metric("duplicates", t.duplicates);
    run.metric("published_per_s", t.accepted_in_load as f64 / secs);
    run.metric("expected_per_s", t.expected as f64 / secs);
    run.metric("delivered_per_s", t.delivered_in_load as f64 / secs);
    run.metric("p50_ms", hist::quantile_ms(&t.latency, 0.5));
    run.metric("p99_ms", hist::quantile_ms(&t.latency, 0.99));
    run.metric("max_ms", t.latency.max() as f64 / 1e3);
    run.metric("connections_lost", t.lost);
    run.metric("server_cpu_s", server_cpu);
    run.metric("server_cpu_pct", server_cpu / secs * 100.0);
    run.metric("client_cpu_s", client_cpu);
    run.metric("server_rss_max_mib", rss_max as f64 / (1 << 20) as f64);
    run.metric(
        "server_rss_per_link_kib",
        rss_max.saturating_sub(rss_before) as f64 / 1024.0 / f64::from(devices.max(1)),
    );
    run.histogram("publish_to_delivered", &t.latency);
    if matches!(load.pace, Pace::Rate { .. }) {
        run.metric("publish_lag_p99_ms", hist::quantile_ms(&t.lag, 0.99));
        run.histogram("publish_lag", &t.lag);
    }
    run.counters("server_", &after.counters.since(&before.counters));
    run.counters("client_", &client);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(pace: Pace) -> Load {
        Load {
            publishers: vec![0, 1],
            subscribers: vec![0, 0, 1],
            qos: QoS::AtLeastOnce,
            payload_bytes: 64,
            pace,
            duration: Duration::from_secs(1),
            drain_timeout: Duration::from_secs(1),
        }
    }

    struct Null;
    impl transport_core::Fleet for Null {
        fn connect(
            &self,
            _: u32,
        ) -> transport_core::BoxFuture<'_, Result<(), transport_core::TransportError>> {
            Box::pin(async { Ok(()) })
        }
        fn send(&self, _: u32, _: transport_core::Order) {}
        fn pending(&self) -> usize {
            0
        }
        fn close(&self) -> transport_core::BoxFuture<'_, ()> {
            Box::pin(async {})
        }
    }

    #[test]
    fn deliveries_count_once_per_subscriber_and_message() {
        let start = Instant::now();
        let mut t = Tally::new(&load(Pace::Window { window: 4 }), start);
        t.publish(&Null, 0, start, start); // channel 0: two subscribers
        t.publish(&Null, 1, start, start); // channel 1: one
        assert_eq!(t.expected, 3);
        let at = start + Duration::from_millis(5);
        let d = |device, id| LinkEvent::Delivered { device, id, at };
        for e in [d(2, 0), d(3, 0), d(4, 1 << 32), d(2, 0)] {
            t.on(&e);
        }
        assert_eq!((t.delivered, t.duplicates), (3, 1));
        // Not expected: a subscriber of another channel, a message never published, a publisher's own device.
        for e in [d(4, 0), d(2, 7), d(0, 0)] {
            t.on(&e);
        }
        assert_eq!((t.delivered, t.duplicates), (3, 4));
        assert_eq!(t.latency.len(), 3);
        assert!(hist::quantile_ms(&t.latency, 0.5) >= 5.0);
    }

    #[test]
    fn an_open_loop_spreads_publishers_over_the_period() {
        let start = Instant::now();
        let t = Tally::new(&load(Pace::Rate { per_s: 10.0 }), start);
        let ms = |i: Instant| i.duration_since(start).as_millis();
        assert_eq!(ms(t.intended(0, 0, 10.0)), 0);
        assert_eq!(ms(t.intended(1, 0, 10.0)), 50);
        assert_eq!(ms(t.intended(0, 3, 10.0)), 300);
    }

    #[test]
    fn qos_parameters_are_0_or_1() {
        assert_eq!(qos(1), Ok(QoS::AtLeastOnce));
        assert!(qos(2).is_err());
    }
}
