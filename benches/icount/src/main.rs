//! `icount`: count the hot paths' instructions under callgrind, keep them as JSON Lines, check them against a
//! baseline. `icount --help` lists the subcommands.

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use icount::callgrind::{cpu_features, guest_cpu_features, valgrind_version, Callgrind};
use icount::meter::Meter;
use icount::results::{self, Comparison, Provenance, Record, SCHEMA};
use icount::scenarios::{self, Scenario};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// The default growth allowed by `--check`, in percent (docs/performance.md says why).
const DEFAULT_TOLERANCE_PCT: f64 = 1.0;

#[derive(Parser)]
#[command(about = "Instruction counts of the hot paths under callgrind")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List the scenarios with what one operation is and the default step count.
    List,
    /// Run one scenario: its setup, a warm-up, then the measured step N times (what callgrind runs; without
    /// callgrind it checks that the scenario works).
    Run {
        scenario: String,
        /// Counted steps (default: the scenario's own).
        #[arg(long)]
        iterations: Option<u64>,
    },
    /// Run every scenario (or those given) under callgrind and write one JSON line per scenario.
    Measure(MeasureOpt),
    /// Make a new PKI for the handshake scenarios (to replace benches/icount/pki: the handshake counts move with it).
    WritePki { dir: PathBuf },
    /// Print the CPU features the measured libraries choose their code paths by (run under valgrind by `measure`).
    #[command(hide = true)]
    CpuFeatures,
    /// Print, as one JSON object, what a count made here depends on besides the code (the provenance `measure`
    /// records), for counts made by other tools in the same format (scripts/generator-instructions.py).
    Provenance,
    /// Compare a results file with a baseline: a Markdown table; exit status 1 if a scenario regressed.
    Compare {
        baseline: PathBuf,
        results: PathBuf,
        /// The growth allowed, in percent.
        #[arg(long, default_value_t = DEFAULT_TOLERANCE_PCT)]
        tolerance: f64,
        /// When the baseline was counted on another machine class, say so and pass (as `measure` does).
        #[arg(long)]
        skip_other_machine: bool,
    },
}

#[derive(clap::Args)]
struct MeasureOpt {
    /// Only the scenarios whose name starts with one of these prefixes (e.g. `pure/`, `mqtt/encode-publish`).
    #[arg(long = "only")]
    only: Vec<String>,
    /// Counted steps of every scenario (default: the baseline's with --check, else each scenario's own).
    #[arg(long)]
    iterations: Option<u64>,
    /// Where to write the results.
    #[arg(long, default_value = "target/icount/icount.jsonl")]
    out: PathBuf,
    /// Where callgrind's output and log files go (open them with callgrind_annotate).
    #[arg(long, default_value = "target/icount/callgrind")]
    callgrind_dir: PathBuf,
    /// Compare with this baseline afterwards; exit status 1 if a scenario grew beyond the tolerance.
    #[arg(long)]
    check: Option<PathBuf>,
    /// The growth allowed by --check, in percent.
    #[arg(long, default_value_t = DEFAULT_TOLERANCE_PCT)]
    tolerance: f64,
    /// With --check: when the baseline was counted on another machine class (other CPU features under valgrind),
    /// say so and pass instead of failing, since the counts cannot be compared (CI on a machine of unknown class).
    #[arg(long)]
    skip_other_machine: bool,
    /// Scenarios run at once (callgrind counts are not disturbed by a busy machine; only the time is).
    #[arg(long, default_value_t = 2)]
    jobs: usize,
}

fn main() {
    if let Err(e) = run(Cli::parse()) {
        eprintln!("icount: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::List => {
            for s in scenarios::ALL {
                println!("{:<36} {:>4}  {}", s.name, s.iterations, s.about);
            }
            Ok(())
        }
        Command::Run {
            scenario,
            iterations,
        } => {
            let s = find(&scenario)?;
            let meter = Meter::new(s.name, iterations.unwrap_or(s.iterations))?;
            (s.run)(&meter).with_context(|| format!("scenario {}", s.name))
        }
        Command::Measure(opt) => measure(opt),
        Command::WritePki { dir } => scenarios::write_pki(&dir),
        Command::CpuFeatures => {
            println!("{}", cpu_features());
            Ok(())
        }
        Command::Provenance => {
            let exe = std::env::current_exe().context("locating this binary")?;
            let provenance = Provenance::here(valgrind_version()?, guest_cpu_features(&exe)?);
            println!("{}", serde_json::to_string(&provenance)?);
            Ok(())
        }
        Command::Compare {
            baseline,
            results: now,
            tolerance,
            skip_other_machine,
        } => {
            let comparison =
                Comparison::new(&results::read(&baseline)?, &results::read(&now)?, tolerance);
            verdict(&comparison, skip_other_machine)
        }
    }
}

fn find(name: &str) -> anyhow::Result<&'static Scenario> {
    scenarios::find(name).with_context(|| {
        let names: Vec<_> = scenarios::ALL.iter().map(|s| s.name).collect();
        format!("no scenario `{name}` (there are: {})", names.join(", "))
    })
}

fn verdict(comparison: &Comparison, skip_other_machine: bool) -> anyhow::Result<()> {
    println!("{}", comparison.markdown());
    if skip_other_machine && comparison.other_machine.is_some() {
        eprintln!("icount: the baseline is from another machine class; nothing compared (--skip-other-machine)");
        return Ok(());
    }
    if comparison.failed() {
        bail!(
            "instruction counts regressed or not comparable: {}",
            comparison.failures().join(", ")
        );
    }
    Ok(())
}

fn measure(opt: MeasureOpt) -> anyhow::Result<()> {
    let started = Instant::now();
    let selected =
        |name: &str| opt.only.is_empty() || opt.only.iter().any(|p| name.starts_with(p.as_str()));
    let chosen: Vec<&Scenario> = scenarios::ALL.iter().filter(|s| selected(s.name)).collect();
    if chosen.is_empty() {
        bail!("no scenario starts with {}", opt.only.join(" or "));
    }
    // With --only, the check holds the chosen scenarios; a baseline scenario this tool no longer has still fails.
    let baseline = match &opt.check {
        Some(path) => {
            let mut base = results::read(path)?;
            base.retain(|r| selected(&r.scenario));
            Some(base)
        }
        None => None,
    };
    // The step count matters to scenarios with amortised costs (a growing set): measure as the baseline did.
    let iterations = |s: &Scenario| {
        opt.iterations
            .or_else(|| {
                let base = baseline.as_ref()?;
                base.iter()
                    .find(|r| r.scenario == s.name)
                    .map(|r| r.iterations)
            })
            .unwrap_or(s.iterations)
    };
    let exe = std::env::current_exe().context("locating this binary")?;
    let callgrind = Callgrind::new(exe.clone(), opt.callgrind_dir.clone())?;
    if !callgrind.no_aslr() {
        eprintln!(
            "icount: `setarch -R` does not work here; running with address space randomisation"
        );
    }
    let provenance = Provenance::here(valgrind_version()?, guest_cpu_features(&exe)?);

    // A small pool: each worker takes the next scenario until none is left.
    let next = AtomicUsize::new(0);
    let done: Mutex<Vec<Option<anyhow::Result<Record>>>> =
        Mutex::new(chosen.iter().map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..opt.jobs.max(1) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(s) = chosen.get(i) else { break };
                let n = iterations(s);
                let t = Instant::now();
                let result = callgrind.count(s.name, n).map(|total| Record {
                    schema: SCHEMA.into(),
                    scenario: s.name.into(),
                    instructions_per_op: (total as f64 / (n * s.ops_per_step) as f64 * 10.0)
                        .round()
                        / 10.0,
                    instructions: total,
                    iterations: n,
                    provenance: provenance.clone(),
                });
                if let Ok(r) = &result {
                    eprintln!(
                        "{:<36} {:>12.1} instructions/op  (N={n}, {:.1} s)",
                        s.name,
                        r.instructions_per_op,
                        t.elapsed().as_secs_f64()
                    );
                }
                done.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(result);
            });
        }
    });
    let mut records = Vec::new();
    let mut failed = Vec::new();
    for (s, result) in chosen
        .iter()
        .zip(done.into_inner().unwrap_or_else(|e| e.into_inner()))
    {
        match result {
            Some(Ok(r)) => records.push(r),
            Some(Err(e)) => failed.push(format!("{}: {e:#}", s.name)),
            None => failed.push(format!("{}: not run", s.name)),
        }
    }
    if !failed.is_empty() {
        bail!(
            "{} scenario(s) failed:\n  {}",
            failed.len(),
            failed.join("\n  ")
        );
    }
    results::write(&opt.out, &records)?;
    eprintln!(
        "icount: {} scenarios in {:.1} s, written to {}",
        records.len(),
        started.elapsed().as_secs_f64(),
        opt.out.display()
    );
    match &baseline {
        Some(base) => verdict(
            &Comparison::new(base, &records, opt.tolerance),
            opt.skip_other_machine,
        ),
        None => Ok(()),
    }
}
