//! `runner [run]`: run workloads against transports, round by round, and print the tables.

use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::PathBuf;
use transport_core::Transport;
use transport_store::SyncPolicy;
use workloads::result::{self, RunResult};
use workloads::{AnyWorkload, Harness, Profile};

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
    /// Workloads to run, comma-separated (see `runner list`).
    #[arg(long, value_name = "LIST", default_value = "drain")]
    pub workload: String,
    /// Size of the runs: quick (CI-sized) or seed (the seeds' parameters).
    #[arg(long, default_value = "quick")]
    pub profile: Profile,
    /// Rounds per transport; each round runs the transports in a rotated order.
    #[arg(long, default_value_t = 3)]
    pub rounds: u32,
    /// Uncounted rounds before the counted ones, for every case: each transport runs as in a round, and the results
    /// are neither written nor shown (recorded as `warmup_rounds` in the provenance). On a VM whose host backs
    /// memory only when it is first touched, the first runs of an invocation pay for that.
    #[arg(long, default_value_t = 0)]
    pub warmup: u32,
    /// The JSON Lines file results are appended to (default: results/<date>.jsonl).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Threads of every server's runtime.
    #[arg(long, default_value_t = 1)]
    pub server_threads: usize,
    /// When the store syncs: none, batch (one fsync per group) or each.
    #[arg(long, default_value = "batch")]
    pub sync: SyncPolicy,
    /// Where runs keep their keys and stores (default: a private temporary directory, removed at the end).
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
    /// Keep each run's keys and store in the work directory instead of removing them.
    #[arg(long)]
    pub keep: bool,
    /// Round trip times for first-contact, in milliseconds, comma-separated (the same as `--param rtt_ms=...`).
    #[arg(long, value_name = "MS[,MS...]", value_delimiter = ',')]
    pub rtt: Vec<u64>,
    /// Set a workload parameter, KEY=VALUE, or sweep it, KEY=V1,V2 (repeatable; applies to every chosen workload
    /// that has the key).
    #[arg(long = "param", value_name = "KEY=VALUE")]
    pub params: Vec<String>,
    /// Pin the server to one CPU and the load generator to the others (where there are two or more): `on` (the
    /// server on the first CPU this process may use), `off`, or the server's CPU number (to swap the two sides'
    /// CPUs, which on a virtual machine need not be equally fast).
    #[arg(long, default_value = "on", value_parser = parse_pin)]
    pub pin: Pin,
    /// Run every case twice, clean and with an adversary beside it (`runner adversary`); the tables show both rows
    /// and the ratio of their primary metrics.
    #[arg(long, visible_alias = "adversary")]
    pub hostile: bool,
}

/// Where `--pin` puts the server and the load generator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pin {
    /// Not pinned.
    Off,
    /// The server on the first CPU this process may use, the generator on the others.
    On,
    /// The server on this CPU, the generator on the others.
    Server(usize),
}

/// `--pin`: `on`, `off` or a CPU number.
fn parse_pin(s: &str) -> Result<Pin, String> {
    match s {
        "on" => Ok(Pin::On),
        "off" => Ok(Pin::Off),
        n => n
            .parse()
            .map(Pin::Server)
            .map_err(|_| "on, off, or the number of the server's CPU".into()),
    }
}

/// Parse the workload list; the first unknown one is the error.
pub fn parse_workloads(list: &str) -> Result<Vec<&'static dyn AnyWorkload>, String> {
    let names: Vec<&str> = list
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if names.is_empty() {
        return Err("no workload given".into());
    }
    names
        .into_iter()
        .map(|name| {
            workloads::by_name(name).ok_or_else(|| {
                let all: Vec<&str> = workloads::ALL.iter().map(|w| w.info().name).collect();
                format!(
                    "unknown workload `{name}` (choose from: {})",
                    all.join(", ")
                )
            })
        })
        .collect()
}

/// The transports of round `round`, rotated so that none always goes first.
pub fn rotation(n: usize, round: u32) -> Vec<usize> {
    (0..n).map(|i| (i + round as usize) % n.max(1)).collect()
}

/// Each chosen workload with the parameter cases it runs.
pub struct Plan {
    pub workloads: Vec<(&'static dyn AnyWorkload, Vec<serde_json::Value>)>,
}

/// Build the plan: each workload's cases for the profile with the overrides applied; an override that fits none
/// of the chosen workloads is an error.
pub fn plan(
    profile: Profile,
    chosen: &[&'static dyn AnyWorkload],
    overrides: &[String],
    rtts: &[u64],
) -> Result<Plan, String> {
    let mut overrides = overrides.to_vec();
    if !rtts.is_empty() {
        let list: Vec<String> = rtts.iter().map(u64::to_string).collect();
        overrides.push(format!("rtt_ms={}", list.join(",")));
    }
    let mut keys: Vec<String> = chosen.iter().flat_map(|w| w.param_keys()).collect();
    keys.sort();
    keys.dedup();
    for o in &overrides {
        let key = workloads::params::key(o)?;
        if !keys.iter().any(|k| k == key) {
            return Err(format!(
                "parameter `{key}` fits no chosen workload (choose from: {})",
                keys.join(", ")
            ));
        }
    }
    let workloads = chosen
        .iter()
        .map(|w| Ok((*w, w.cases(profile, &overrides)?)))
        .collect::<Result<_, String>>()?;
    Ok(Plan { workloads })
}

pub async fn run(
    args: RunArgs,
    transports: Vec<Box<dyn Transport>>,
    plan: Plan,
    pinning: workloads::pin::Pinning,
) -> Result<()> {
    if args.rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    if args.server_threads == 0 {
        bail!("--server-threads must be at least 1");
    }
    let mut provenance = crate::provenance::collect(args.profile.name(), pinning);
    provenance.warmup_rounds = args.warmup;
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
            temp = private_work_dir().context("creating a temporary work directory")?;
            temp.path().to_path_buf()
        }
    };
    // Every run in order, for the progress line: (workload, transport and whether hostile).
    let variants: &[bool] = if args.hostile {
        &[false, true]
    } else {
        &[false]
    };
    let mut order: Vec<(String, String)> = Vec::new();
    for (workload, cases) in &plan.workloads {
        for _ in cases {
            for round in 0..args.warmup {
                for i in rotation(transports.len(), round) {
                    order.push((
                        workload.info().name.to_string(),
                        format!("{} · warm-up", transports[i].spec()),
                    ));
                }
            }
            for round in 0..args.rounds {
                for i in rotation(transports.len(), round) {
                    for hostile in variants {
                        let suffix = if *hostile { " · hostile" } else { "" };
                        order.push((
                            workload.info().name.to_string(),
                            format!("{}{suffix}", transports[i].spec()),
                        ));
                    }
                }
            }
        }
    }
    let mut progress = crate::progress::Progress::new(order);
    let harness = Harness {
        runner: std::env::current_exe().context("locating the runner binary")?,
        work_dir,
        server_threads: args.server_threads,
        sync: args.sync,
        profile: args.profile,
        provenance,
        keep: args.keep,
        progress: progress.printer(),
        hostile: false,
    };
    let hostile = Harness {
        hostile: true,
        ..harness.clone()
    };
    // Each case clean, then (with --hostile) with the adversary, one after the other.
    let harnesses: Vec<&Harness> = if args.hostile {
        vec![&harness, &hostile]
    } else {
        vec![&harness]
    };
    let mut results: Vec<RunResult> = Vec::new();
    let mut failures = 0;
    for (workload, cases) in &plan.workloads {
        let name = workload.info().name;
        for case in cases {
            for round in 0..args.warmup {
                for i in rotation(transports.len(), round) {
                    let t = transports[i].as_ref();
                    progress.start(&format!(
                        "{name} · {} · warm-up {}/{}",
                        t.spec(),
                        round + 1,
                        args.warmup
                    ));
                    let r = harness.run(*workload, t, round, case).await;
                    progress.end();
                    // Not counted, but a warm-up that fails says so: the counted rounds would likely fail too.
                    if let Some(e) = &r.error {
                        progress.println(&format!(
                            "warm-up error: {name} {} round {round}: {e}",
                            t.spec()
                        ));
                    }
                }
            }
            for round in 0..args.rounds {
                let order: Vec<(usize, usize)> = rotation(transports.len(), round)
                    .into_iter()
                    .flat_map(|i| (0..harnesses.len()).map(move |k| (i, k)))
                    .collect();
                for (i, k) in order {
                    let h = harnesses[k];
                    let t = transports[i].as_ref();
                    progress.start(&format!(
                        "{name} · {}{} · round {}/{}",
                        t.spec(),
                        if h.hostile { " · hostile" } else { "" },
                        round + 1,
                        args.rounds
                    ));
                    // A failed run is on record too, with its error, so a check of the file fails on it.
                    let r = h.run(*workload, t, round, case).await;
                    progress.end();
                    match (&r.error, &r.skipped) {
                        (Some(e), _) => {
                            progress
                                .println(&format!("error: {name} {} round {round}: {e}", t.spec()));
                            failures += 1;
                        }
                        (None, Some(reason)) => progress.println(&format!("  n/a: {reason}")),
                        (None, None) => progress.println(&format!("  {}", summary(*workload, &r))),
                    }
                    result::append(&out, std::slice::from_ref(&r))
                        .with_context(|| format!("writing {}", out.display()))?;
                    results.push(r);
                }
            }
        }
    }
    drop(progress);
    println!("{}", crate::report::render(&results));
    eprintln!("results: {} ({} runs)", out.display(), results.len());
    if failures > 0 {
        bail!("{failures} run(s) failed");
    }
    Ok(())
}

/// One line per run: the workload's columns that have a value.
fn summary(workload: &dyn AnyWorkload, r: &RunResult) -> String {
    let mut seen = Vec::new();
    workload
        .info()
        .columns
        .iter()
        .filter(|c| {
            let new = !seen.contains(&c.metric);
            seen.push(c.metric);
            new
        })
        .filter_map(|c| {
            r.metric(c.metric).map(|v| {
                let v = if v.fract() == 0.0 {
                    format!("{v}")
                } else {
                    format!("{v:.2}")
                };
                format!("{}={v}", c.metric)
            })
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The work directory of a run given no `--work-dir`: a new directory with a random name under the system's
/// temporary directory (created, never an existing one or a symlink planted there), mode 0700 so that no other user
/// reads the stores and session files the runs keep in it (`tempfile` alone would leave the umask's 0755).
fn private_work_dir() -> std::io::Result<tempfile::TempDir> {
    use std::os::unix::fs::PermissionsExt;
    tempfile::Builder::new()
        .prefix("runner-")
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_temporary_work_directory_is_new_and_private() {
        use std::os::unix::fs::PermissionsExt;
        let (a, b) = (private_work_dir().unwrap(), private_work_dir().unwrap());
        assert_ne!(a.path(), b.path(), "a random name, not the pid");
        for dir in [&a, &b] {
            let meta = std::fs::symlink_metadata(dir.path()).unwrap();
            assert!(meta.is_dir());
            assert_eq!(
                meta.permissions().mode() & 0o777,
                0o700,
                "{}",
                dir.path().display()
            );
        }
    }

    #[test]
    fn rounds_rotate_the_order() {
        assert_eq!(rotation(3, 0), vec![0, 1, 2]);
        assert_eq!(rotation(3, 1), vec![1, 2, 0]);
        assert_eq!(rotation(3, 4), vec![1, 2, 0]);
    }

    #[test]
    fn unknown_workloads_name_the_choices() {
        let e = parse_workloads("drain,nope").err().unwrap();
        assert!(e.contains("nope") && e.contains("drain"), "{e}");
    }

    #[test]
    fn overrides_sweep_and_must_fit_a_workload() {
        let chosen = parse_workloads("drain,first-contact").unwrap();
        let p = plan(Profile::Quick, &chosen, &["orders=500".into()], &[20, 40]).unwrap();
        let (_, drain) = &p.workloads[0];
        assert_eq!(drain[0]["orders"], 500);
        let (_, fc) = &p.workloads[1];
        let rtts: Vec<u64> = fc.iter().map(|c| c["rtt_ms"].as_u64().unwrap()).collect();
        assert_eq!(rtts, vec![20, 40]);
        let e = plan(Profile::Quick, &chosen, &["nope=1".into()], &[])
            .err()
            .unwrap();
        assert!(e.contains("nope"), "{e}");
        let e = plan(Profile::Quick, &chosen, &[], &[0]).err().unwrap();
        assert!(e.contains("between 1 and 60000"), "{e}");
    }
}
