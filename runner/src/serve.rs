//! `runner serve`: run the server side of one transport in this process until killed.
//!
//! Prints one JSON line when listening (`{"ready": {...}}`), then answers each `stats` line on stdin with one JSON
//! line ([`stats_line`]: counters, the store's statistics, filesystem, fsync times and failure, CPU). Exits when stdin
//! closes, so a server never outlives its runner, or when the transport's server stops (its store failed); either
//! way it writes its statistics one last time first, with the error that stopped it if one did.
//!
//! For tests only: with the environment variable [`BROKEN_STATS_ENV`] set, every stats answer is a JSON object that
//! is not the statistics, so a test can prove that a broken control line fails a run and its check.

use anyhow::{bail, Context, Result};
use clap::Args;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncBufReadExt;
use transport_core::commit::{CommitError, OrderStore, Outcome, SharedStore, StateSyncs};
use transport_core::{BoxFuture, Counters, Order, ServeConfig, Transport};
use transport_store::{Store, StoreHandle, SyncPolicy};
use workloads::process::{ReadyLine, ReadyMessage};

/// Set (to anything) in a server's environment, its control line answers something that is not its statistics.
pub const BROKEN_STATS_ENV: &str = "RUNNER_TEST_BROKEN_STATS";

/// Serve one transport.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The transport spec, e.g. `pure:plain`.
    #[arg(long)]
    pub transport: String,
    /// Address to listen on (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// The directory the transport's `prepare` wrote (keys, certificates, allowed senders).
    #[arg(long)]
    pub identity: PathBuf,
    /// The store's directory (created if missing; an existing log is recovered).
    #[arg(long)]
    pub store: PathBuf,
    /// When the store syncs: none, batch (one fsync per group) or each.
    #[arg(long, default_value = "batch")]
    pub sync: SyncPolicy,
    /// Threads of the server's runtime.
    #[arg(long, default_value_t = 1)]
    pub server_threads: usize,
    /// Pure: an allowed sender, NAME=KEY (repeatable); replaces the identity directory's list.
    #[arg(long = "sender", value_name = "NAME=KEY")]
    pub senders: Vec<String>,
    /// Pure: a file of NAME=KEY lines; replaces the identity directory's list.
    #[arg(long = "senders", value_name = "FILE")]
    pub senders_file: Option<PathBuf>,
}

/// The transport to serve: the spec's, with Pure's allow-list from the command line where one is given.
fn transport(args: &ServeArgs) -> Result<Box<dyn Transport>> {
    let mut senders = args.senders.clone();
    if let Some(f) = &args.senders_file {
        senders.push(format!("@{}", f.display()));
    }
    if senders.is_empty() {
        return crate::registry::transport(&args.transport).map_err(anyhow::Error::msg);
    }
    match transport_pure::variant(&args.transport) {
        Some(pure) => Ok(Box::new(pure.with_senders(senders))),
        None => {
            crate::registry::transport(&args.transport).map_err(anyhow::Error::msg)?;
            bail!(
                "--sender and --senders apply to the Pure transports only, not `{}`",
                args.transport
            )
        }
    }
}

/// The environment variable that slows one transport's server on purpose, for testing the regression gate:
/// `SPEC:MICROSECONDS`, busy CPU spent per committed order on the server's own thread (e.g. `quinn:50`). A server of
/// another transport ignores it. Never set it for a measurement.
pub const HANDICAP_ENV: &str = "RUNNER_HANDICAP";

/// The handicap for `spec` from [`HANDICAP_ENV`] (`SPEC:MICROSECONDS`, several separated by commas): none if unset
/// or for another transport.
fn handicap(spec: &str) -> Result<Option<Duration>> {
    let Ok(value) = std::env::var(HANDICAP_ENV) else {
        return Ok(None);
    };
    let mut found = None;
    for entry in value.split(',') {
        let (target, us) = entry.rsplit_once(':').with_context(|| {
            format!("{HANDICAP_ENV}={value}: expected SPEC:MICROSECONDS[,SPEC:MICROSECONDS...]")
        })?;
        let us: u64 = us.parse().with_context(|| {
            format!("{HANDICAP_ENV}={value}: {us} is not a number of microseconds")
        })?;
        if target == spec {
            found = Some(Duration::from_micros(us));
        }
    }
    Ok(found)
}

/// A store that burns `per_order` of CPU on the calling thread for each order before committing ([`HANDICAP_ENV`]).
struct Handicapped {
    inner: SharedStore,
    per_order: Duration,
}

impl OrderStore for Handicapped {
    fn commit(&self, orders: Vec<Order>) -> BoxFuture<'static, Result<Vec<Outcome>, CommitError>> {
        let until = Instant::now() + self.per_order * orders.len() as u32;
        while Instant::now() < until {
            std::hint::spin_loop();
        }
        self.inner.commit(orders)
    }
}

pub fn run(args: ServeArgs) -> Result<()> {
    let transport = transport(&args)?;
    let handicap = handicap(&args.transport)?;
    if let Some(h) = handicap {
        eprintln!(
            "serve: {} handicapped by {} µs of CPU per order ({HANDICAP_ENV})",
            args.transport,
            h.as_micros()
        );
    }
    if args.server_threads == 0 {
        bail!("--server-threads must be at least 1");
    }
    let (store, recovery) = Store::open(&args.store, args.sync)
        .with_context(|| format!("opening the store {}", args.store.display()))?;
    let filesystem = transport_store::fs::filesystem(&args.store)
        .with_context(|| format!("reading the filesystem of {}", args.store.display()))?;
    if recovery.truncated_bytes > 0 {
        eprintln!(
            "store: cut a torn tail of {} bytes after {} records",
            recovery.truncated_bytes, recovery.records
        );
    }
    let runtime = if args.server_threads == 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(args.server_threads)
            .enable_all()
            .build()?
    };
    runtime.block_on(async move {
        let store = StoreHandle::spawn(store);
        let counters = Arc::new(Counters::default());
        let state_syncs = Arc::new(StateSyncs::default());
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let config = ServeConfig {
            listen: args.listen,
            identity: args.identity.clone(),
            store: match handicap {
                Some(per_order) => Arc::new(Handicapped {
                    inner: Arc::new(store.clone()),
                    per_order,
                }),
                None => Arc::new(store.clone()),
            },
            state_dir: args.store.clone(),
            counters: counters.clone(),
            state_syncs: state_syncs.clone(),
            ready: ready_tx,
        };
        let mut server = tokio::spawn(transport.serve(config));
        let ready = tokio::select! {
            r = ready_rx => r.ok(),
            r = &mut server => {
                match r {
                    Ok(Err(e)) => bail!("{e}"),
                    Ok(Ok(())) => bail!("the server stopped before it was ready"),
                    Err(e) => bail!("the server task failed: {e}"),
                }
            }
        };
        let Some(ready) = ready else {
            // The transport dropped its ready sender: it failed while starting; report its error.
            match server.await {
                Ok(Err(e)) => bail!("{e}"),
                _ => bail!("the server stopped before it was ready"),
            }
        };
        let line = ReadyMessage {
            ready: ReadyLine {
                transport: args.transport.clone(),
                addr: ready.addr,
                public_key: ready.public_key,
                pid: std::process::id(),
                serving_pid: ready.serving_pid,
            },
        };
        print_line(&serde_json::to_string(&line)?)?;

        let broken = std::env::var_os(BROKEN_STATS_ENV).is_some();
        let answer = |error: Option<&anyhow::Error>| {
            if broken {
                return serde_json::json!({ "broken": "not the statistics" }).to_string();
            }
            stats_line(&counters, &store, &state_syncs, &filesystem, error).to_string()
        };
        let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
        let outcome: Result<()> = loop {
            tokio::select! {
                r = &mut server => {
                    break match r {
                        Ok(Err(e)) => Err(anyhow::anyhow!("{e}")),
                        Ok(Ok(())) => Ok(()),
                        Err(e) => Err(anyhow::anyhow!("the server task failed: {e}")),
                    };
                }
                line = lines.next_line() => {
                    match line {
                        Err(e) => break Err(e.into()),
                        Ok(None) => break Ok(()),
                        Ok(Some(l)) if l.trim() == "stats" => print_line(&answer(None))?,
                        Ok(Some(_)) => print_line("{\"error\":\"unknown command\"}")?,
                    }
                }
            }
        };
        // The last word: a runner shutting the server down, or finding out why it stopped, reads it. Its own output
        // may be gone (the runner died): the outcome stands either way.
        let _ = print_line(&answer(outcome.as_ref().err()));
        outcome
    })
}

/// The answer to `stats`: the server's counters; its store's statistics, the filesystem it is on, every fsync's
/// time (HDR histogram in µs, V2 base64) and the reason it failed if it did; the same histogram of the syncs of the
/// server's own state (`state_fsync_us`: the MQTT broker's persistent sessions); CPU seconds from getrusage
/// (microsecond resolution, every thread, exited ones included), or the error reading them (never a zero); and the
/// error that stopped the server, in its last line.
pub fn stats_line(
    counters: &Counters,
    store: &StoreHandle,
    state_syncs: &StateSyncs,
    filesystem: &str,
    error: Option<&anyhow::Error>,
) -> serde_json::Value {
    let mut v = serde_json::json!({
        "counters": counters.snapshot(),
        "store": store.stats(),
        "store_fs": filesystem,
        "fsync_us": workloads::hist::encode(&store.sync_histogram()),
        "state_fsync_us": workloads::hist::encode(&state_syncs.histogram()),
        "store_failed": store.failure(),
    });
    match transport_core::procfs::self_cpu_time() {
        Ok(cpu) => v["cpu_s"] = cpu.as_secs_f64().into(),
        Err(e) => v["error"] = format!("getrusage: {e}").into(),
    }
    if let Some(e) = error {
        v["error"] = format!("{e:#}").into();
    }
    v
}

fn print_line(line: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()?;
    Ok(())
}
