//! `runner [run]`: run workloads against transports, round by round, and print the tables.

use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::PathBuf;
use std::sync::Arc;
use transport_core::{Support, SyncPolicy, Transport, WorkloadKind};
use workloads::result::{self, RunResult};
use workloads::{Harness, Profile};

/// Run workloads against transports.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Transports to compare, comma-separated (see `runner list`).
    #[arg(
        long,
        value_name = "LIST",
        default_value = "pure:plain,pure:hpke-session,pure:hpke-per-request"
    )]
    pub transport: String,
    /// Workloads to run, comma-separated.
    #[arg(long, value_name = "LIST", default_value = "drain")]
    pub workload: String,
    /// Size of the runs: quick (CI-sized) or seed (the seeds' parameters).
    #[arg(long, default_value = "quick")]
    pub profile: Profile,
    /// Rounds per transport; each round runs the transports in a rotated order.
    #[arg(long, default_value_t = 3)]
    pub rounds: u32,
    /// The JSON Lines file results are appended to (default: results/<date>.jsonl).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Threads of every server's runtime.
    #[arg(long, default_value_t = 1)]
    pub server_threads: usize,
    /// When the store syncs: none, batch (one fsync per group) or each.
    #[arg(long, default_value = "batch")]
    pub sync: SyncPolicy,
    /// Where runs keep their keys and stores (default: a temporary directory, removed at the end).
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
    /// Round trip times for first-contact, in milliseconds, comma-separated (default: the seed's 10,50,100).
    #[arg(long, value_name = "MS[,MS...]", value_delimiter = ',')]
    pub rtt: Vec<u64>,
    /// Override a workload parameter, KEY=VALUE (repeatable; applies to every workload that has the key).
    #[arg(long = "param", value_name = "KEY=VALUE")]
    pub params: Vec<String>,
}

/// Parse the workload list; the first unknown one is the error.
pub fn parse_workloads(list: &str) -> Result<Vec<WorkloadKind>, String> {
    let ws: Vec<&str> = list
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if ws.is_empty() {
        return Err("no workload given".into());
    }
    ws.into_iter()
        .map(|w| {
            let kind: WorkloadKind = w.parse()?;
            if implemented(kind) {
                Ok(kind)
            } else {
                Err(format!(
                    "workload `{w}` is not implemented yet (implemented: {})",
                    implemented_names()
                ))
            }
        })
        .collect()
}

pub fn implemented(kind: WorkloadKind) -> bool {
    matches!(
        kind,
        WorkloadKind::Drain | WorkloadKind::Restart | WorkloadKind::FirstContact
    )
}

fn implemented_names() -> String {
    WorkloadKind::ALL
        .iter()
        .filter(|k| implemented(**k))
        .map(|k| k.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The transports of round `round`, rotated so that none always goes first.
pub fn rotation(n: usize, round: u32) -> Vec<usize> {
    (0..n).map(|i| (i + round as usize) % n.max(1)).collect()
}

/// The parameters of every workload for a profile, with the user's overrides applied.
pub struct Plan {
    drain: workloads::drain::DrainParams,
    restart: workloads::restart::RestartParams,
    first_contact: workloads::first_contact::FirstContactParams,
    rtts: Vec<u64>,
}

/// Build the plan; an override that fits none of the chosen workloads is an error.
pub fn plan(
    profile: Profile,
    kinds: &[WorkloadKind],
    overrides: &[String],
    rtts: &[u64],
) -> Result<Plan, String> {
    use workloads::first_contact::{FirstContactParams, SEED_RTTS_MS};
    use workloads::harness::override_params;
    let rtts = if rtts.is_empty() {
        SEED_RTTS_MS.to_vec()
    } else {
        rtts.to_vec()
    };
    if let Some(bad) = rtts.iter().find(|&&r| r == 0 || r > 60_000) {
        return Err(format!(
            "--rtt {bad}: a round trip time must be between 1 and 60000 ms"
        ));
    }
    let mut plan = Plan {
        drain: workloads::drain::DrainParams::for_profile(profile),
        restart: workloads::restart::RestartParams::for_profile(profile),
        first_contact: FirstContactParams::for_profile(profile, rtts[0]),
        rtts,
    };
    for o in overrides {
        let one = std::slice::from_ref(o);
        let mut used = false;
        let mut last_err = String::new();
        for kind in kinds {
            let r = match kind {
                WorkloadKind::Drain => override_params(&plan.drain, one).map(|p| plan.drain = p),
                WorkloadKind::Restart => {
                    override_params(&plan.restart, one).map(|p| plan.restart = p)
                }
                WorkloadKind::FirstContact => {
                    override_params(&plan.first_contact, one).map(|p| plan.first_contact = p)
                }
                _ => Err(String::new()),
            };
            match r {
                Ok(()) => used = true,
                Err(e) => last_err = e,
            }
        }
        if !used {
            return Err(if last_err.is_empty() {
                format!("parameter `{o}` fits no chosen workload")
            } else {
                last_err
            });
        }
    }
    Ok(plan)
}

pub async fn run(
    args: RunArgs,
    transports: Vec<Box<dyn Transport>>,
    kinds: Vec<WorkloadKind>,
    plan: Plan,
) -> Result<()> {
    if args.rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    if args.server_threads == 0 {
        bail!("--server-threads must be at least 1");
    }
    let provenance = crate::provenance::collect(args.profile.name());
    let out = args.out.clone().unwrap_or_else(|| {
        PathBuf::from("results").join(format!("{}.jsonl", provenance.date.replace([':', '-'], "")))
    });
    let temp;
    let work_dir = match &args.work_dir {
        Some(d) => {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
            d.clone()
        }
        None => {
            temp = tempdir()?;
            temp.0.clone()
        }
    };
    let harness = Harness {
        runner: std::env::current_exe().context("locating the runner binary")?,
        work_dir,
        server_threads: args.server_threads,
        sync: args.sync,
        profile: args.profile,
        provenance,
        progress: Arc::new(|line: &str| eprintln!("{line}")),
    };
    let mut results: Vec<RunResult> = Vec::new();
    let mut failures = 0;
    for kind in &kinds {
        // first-contact runs once per RTT; the others once.
        let settings: Vec<Option<u64>> = match kind {
            WorkloadKind::FirstContact => plan.rtts.iter().map(|r| Some(*r)).collect(),
            _ => vec![None],
        };
        for setting in settings {
            for round in 0..args.rounds {
                for i in rotation(transports.len(), round) {
                    let t = transports[i].as_ref();
                    let r = match t.supports(*kind) {
                        Support::No(reason) => {
                            let mut r = harness.result(
                                kind.name(),
                                t.spec(),
                                round,
                                &serde_json::json!({}),
                            );
                            r.skipped = Some(reason.to_string());
                            r
                        }
                        Support::Yes => {
                            eprintln!(
                                "{kind} · {} · round {}/{}",
                                t.spec(),
                                round + 1,
                                args.rounds
                            );
                            match run_one(&harness, &plan, *kind, setting, t, round).await {
                                Ok(r) => r,
                                Err(e) => {
                                    eprintln!("error: {kind} {} round {round}: {e:#}", t.spec());
                                    failures += 1;
                                    continue;
                                }
                            }
                        }
                    };
                    if r.skipped.is_none() {
                        eprintln!("  {}", summary(&r));
                    }
                    result::append(&out, std::slice::from_ref(&r))
                        .with_context(|| format!("writing {}", out.display()))?;
                    results.push(r);
                }
            }
        }
    }
    println!("{}", crate::report::render(&results));
    eprintln!("results: {} ({} runs)", out.display(), results.len());
    if failures > 0 {
        bail!("{failures} run(s) failed");
    }
    Ok(())
}

async fn run_one(
    h: &Harness,
    plan: &Plan,
    kind: WorkloadKind,
    setting: Option<u64>,
    t: &dyn Transport,
    round: u32,
) -> Result<RunResult> {
    Ok(match kind {
        WorkloadKind::FirstContact => {
            let mut p = plan.first_contact.clone();
            p.rtt_ms = setting.unwrap_or(p.rtt_ms);
            workloads::first_contact::run(h, t, round, &p).await?
        }
        WorkloadKind::Drain => workloads::drain::run(h, t, round, &plan.drain).await?,
        WorkloadKind::Restart => workloads::restart::run(h, t, round, &plan.restart).await?,
        other => bail!("workload `{other}` is not implemented yet"),
    })
}

fn summary(r: &RunResult) -> String {
    let keys = [
        "orders_per_second",
        "rtt_ms",
        "p50_ms",
        "round_trips",
        "up_ms",
        "stall_bins",
        "catch_up_s",
        "asym_ops_after",
        "handshakes_after",
        "resent",
        "lost",
        "duplicates",
        "server_cpu_s",
    ];
    keys.iter()
        .filter_map(|k| {
            r.metric(k).map(|v| {
                format!(
                    "{k}={}",
                    if v.fract() == 0.0 {
                        format!("{v}")
                    } else {
                        format!("{v:.2}")
                    }
                )
            })
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// A temporary directory removed on drop.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tempdir() -> Result<TempDir> {
    let base = std::env::temp_dir().join(format!("runner-{}", std::process::id()));
    std::fs::create_dir_all(&base).with_context(|| format!("creating {}", base.display()))?;
    Ok(TempDir(base))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_rotate_the_order() {
        assert_eq!(rotation(3, 0), vec![0, 1, 2]);
        assert_eq!(rotation(3, 1), vec![1, 2, 0]);
        assert_eq!(rotation(3, 4), vec![1, 2, 0]);
    }

    #[test]
    fn unknown_workloads_name_the_choices() {
        let e = parse_workloads("drain,nope").unwrap_err();
        assert!(e.contains("nope") && e.contains("drain"), "{e}");
    }
}
