//! `runner worker`: one slice of a run's load generator in a process of its own (`workloads::worker`): devices
//! `first..first + count` of the run's identity directory, driven by commands on stdin, one JSON answer per line on
//! stdout. The runner starts it as a child process when a workload needs more links than one process may hold;
//! it exits when its stdin closes, and the kernel kills it if the runner dies.

use anyhow::Result;
use clap::Args;
use std::net::SocketAddr;
use std::path::PathBuf;
use workloads::worker::{self, WorkerConfig};

/// Run one slice of a load generator.
#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// The transport spec, e.g. `quinn`.
    #[arg(long)]
    pub transport: String,
    /// The run's identity directory (the transport's `prepare` wrote it).
    #[arg(long)]
    pub identity: PathBuf,
    /// The server's address.
    #[arg(long)]
    pub server: SocketAddr,
    /// The first device of this slice.
    #[arg(long, default_value_t = 0)]
    pub first: u32,
    /// How many devices.
    #[arg(long)]
    pub count: u32,
}

pub fn run(args: WorkerArgs) -> Result<()> {
    let transport = crate::registry::transport(&args.transport).map_err(anyhow::Error::msg)?;
    let config = WorkerConfig {
        server: args.server,
        identity: args.identity,
        first: args.first,
        count: args.count,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let input = tokio::io::BufReader::new(tokio::io::stdin());
    let served = runtime.block_on(worker::serve(
        transport.as_ref(),
        config,
        input,
        tokio::io::stdout(),
    ));
    // Whatever the fleet left running stops here; never wait long for it.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    Ok(served?)
}
