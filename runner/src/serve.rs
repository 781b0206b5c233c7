//! `runner serve`: run the server side of one transport in this process until killed.
//!
//! Prints one JSON line when listening (`{"ready": {...}}`), then answers each `stats` line on stdin with one JSON
//! line (`{"counters": ..., "store": ..., "cpu_s": ...}`). Exits when stdin closes, so a server never outlives its runner.

use anyhow::{bail, Context, Result};
use clap::Args;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use tokio::io::AsyncBufReadExt;
use transport_core::{Counters, ServeConfig, Transport};
use transport_store::{Store, StoreHandle, SyncPolicy};
use workloads::process::{ReadyLine, ReadyMessage};

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

pub fn run(args: ServeArgs) -> Result<()> {
    let transport = transport(&args)?;
    if args.server_threads == 0 {
        bail!("--server-threads must be at least 1");
    }
    let (store, recovery) = Store::open(&args.store, args.sync)
        .with_context(|| format!("opening the store {}", args.store.display()))?;
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
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let config = ServeConfig {
            listen: args.listen,
            identity: args.identity.clone(),
            store: Arc::new(store.clone()),
            state_dir: args.store.clone(),
            counters: counters.clone(),
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

        let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
        loop {
            tokio::select! {
                r = &mut server => {
                    match r {
                        Ok(Err(e)) => bail!("{e}"),
                        Ok(Ok(())) => return Ok(()),
                        Err(e) => bail!("the server task failed: {e}"),
                    }
                }
                line = lines.next_line() => {
                    match line? {
                        None => return Ok(()),
                        Some(l) if l.trim() == "stats" => {
                            // CPU from getrusage: microsecond resolution, every thread, exited ones included. A
                            // figure that cannot be read is reported as an error, never as zero.
                            let v = match transport_core::procfs::self_cpu_time() {
                                Ok(cpu) => serde_json::json!({
                                    "counters": counters.snapshot(),
                                    "store": store.stats(),
                                    "cpu_s": cpu.as_secs_f64(),
                                }),
                                Err(e) => serde_json::json!({ "error": format!("getrusage: {e}") }),
                            };
                            print_line(&v.to_string())?;
                        }
                        Some(_) => print_line("{\"error\":\"unknown command\"}")?,
                    }
                }
            }
        }
    })
}

fn print_line(line: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()?;
    Ok(())
}
