//! `runner adversary`: a hostile peer against one server, until its input ends (see `workloads::adversary`).
//!
//! The runner starts it beside every run of `runner run --hostile`; it can also be started by hand against any
//! server whose identity it was enrolled in. Prints one ready line, then answers `stats` (and `quiet`) with what it
//! has sent, by kind.

use anyhow::{bail, Result};
use clap::Args;
use std::net::SocketAddr;
use std::path::PathBuf;
use workloads::adversary::{self, hostile, Config};

/// Attack one server.
#[derive(Debug, Args)]
pub struct AdversaryArgs {
    /// The transport spec of the server, e.g. `pure:plain`.
    #[arg(long)]
    pub transport: String,
    /// The server's address.
    #[arg(long)]
    pub target: SocketAddr,
    /// The adversary's own identity directory (what enrolment gave it).
    #[arg(long)]
    pub identity: PathBuf,
    /// Datagrams, records and packets per second, over every cheap kind together.
    #[arg(long, default_value_t = hostile::RATE)]
    pub rate: f64,
    /// Connections (handshakes) per second, over every kind that opens one together.
    #[arg(long, default_value_t = hostile::CONNECT_RATE)]
    pub connect_rate: f64,
}

pub fn run(args: AdversaryArgs) -> Result<()> {
    if !(args.rate > 0.0 && args.connect_rate > 0.0) {
        bail!("--rate and --connect-rate must be above 0");
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let config = Config {
        spec: args.transport,
        target: args.target,
        identity: args.identity,
        rate: args.rate,
        connect_rate: args.connect_rate,
    };
    runtime.block_on(adversary::serve(config))?;
    Ok(())
}
