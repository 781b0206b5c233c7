//! `runner`: benchmark network transports side by side.
//!
//! `runner --transport pure,quinn --workload restart` runs workloads (the default subcommand); `runner serve` runs
//! the server side of one transport (the runner starts it as a child process); `runner worker` runs a slice of a
//! load generator (likewise); `runner report` renders tables, charts and a self-contained HTML page from results
//! files; `runner compare` tells what changed between two of them; `runner export` writes them for benchmark
//! dashboards; `runner list` names the transports and workloads; `runner adversary` is the hostile peer
//! `runner run --hostile` starts beside every run.

mod adversary;
mod chart;
mod check;
mod compare;
mod export;
mod hostile;
mod progress;
mod provenance;
mod registry;
mod report;
mod run;
mod serve;
mod worker;

/// Both of the runner's processes (the server is `runner serve`) allocate with mimalloc unless built without the
/// `mimalloc` feature: glibc's `malloc` and `free` were a fifth of the QUIC load generator's CPU in a drain, and a
/// production service would not run on them either. Every result records which ([`ALLOCATOR`]).
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The allocator this runner was built with, as results record it.
pub(crate) const ALLOCATOR: &str = if cfg!(feature = "mimalloc") {
    "mimalloc"
} else {
    "system"
};

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Debug, Parser)]
#[command(
    name = "runner",
    version,
    about = "Benchmark network transports side by side"
)]
#[command(args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: run::RunArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run workloads against transports (the default).
    Run(run::RunArgs),
    /// Run the server side of one transport until killed.
    Serve(serve::ServeArgs),
    /// Run a slice of a load generator's devices, controlled over stdin (the runner starts it as a child process).
    Worker(worker::WorkerArgs),
    /// Attack one server until the input ends (started by `run --hostile`).
    Adversary(adversary::AdversaryArgs),
    /// Render the tables of results files (Markdown on stdout), their charts, or one self-contained HTML page.
    Report {
        /// JSON Lines results files.
        #[arg(required_unless_present = "fill")]
        files: Vec<PathBuf>,
        /// Refill the generated tables of a Markdown page (`<!-- report FILE -->` ... `<!-- end report -->`) from
        /// the results folder the page names, keeping its commentary (docs/report.md, "Generated pages").
        #[arg(long, value_name = "PAGE", conflicts_with_all = ["files", "html", "markdown", "svg"])]
        fill: Option<PathBuf>,
        /// With --fill: take the tables from this folder, and name it in the page.
        #[arg(long, value_name = "DIR", requires = "fill")]
        from: Option<PathBuf>,
        /// With --fill: change nothing; fail if the page is not what filling it would make.
        #[arg(long, requires = "fill")]
        check: bool,
        /// Write one self-contained HTML page (tables, charts, checks, provenance) to this file.
        #[arg(long, value_name = "FILE")]
        html: Option<PathBuf>,
        /// Write the Markdown tables to this file instead of stdout.
        #[arg(long, value_name = "FILE")]
        markdown: Option<PathBuf>,
        /// Also write every chart as an SVG file into this directory.
        #[arg(long, value_name = "DIR")]
        svg: Option<PathBuf>,
    },
    /// Check results: hard invariants, and ratios measured in the same run against a baseline.
    Check {
        /// JSON Lines results files to check.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// A results file whose same-run ratios the checked results must not fall behind.
        #[arg(long)]
        baseline: Option<PathBuf>,
        /// How much worse than the baseline's a ratio may be (0.25 = 25%).
        #[arg(long, default_value_t = 0.25)]
        tolerance: f64,
        /// Gate only the ratios whose values in the baseline's invocations are at most this far apart
        /// (`max/min - 1`; 0.05 = 5%); report the others without failing on them. Default: gate every ratio.
        #[arg(long, value_name = "SPREAD", requires = "baseline")]
        max_reference_spread: Option<f64>,
        /// Pass runs whose only doubt is a busy load generator, still naming them (smoke runs on a small shared
        /// machine, where the timing is not what is checked).
        #[arg(long)]
        allow_generator_bound: bool,
        /// Pass drains whose only doubt is a server that was not saturated (it waited for the devices), still
        /// naming them (smoke runs without pinning, where the server shares its CPUs with everything else).
        #[arg(long)]
        allow_unsaturated: bool,
    },
    /// What changed from results A to results B: per case, transport and metric, the change with a confidence
    /// interval over rounds, "no change" when it spans zero.
    Compare {
        /// The earlier results.
        a: PathBuf,
        /// The later results.
        b: PathBuf,
        /// The confidence of the intervals (few rounds allow less; the table says what each has).
        #[arg(long, default_value_t = 0.95)]
        confidence: f64,
    },
    /// Write results in a benchmark dashboard's format (JSON on stdout or into a file).
    Export {
        /// github-bigger / github-smaller: github-action-benchmark's customBiggerIsBetter / customSmallerIsBetter;
        /// bencher: Bencher Metric Format.
        #[arg(long, value_enum)]
        format: export::ExportFormat,
        /// JSON Lines results files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Write to this file instead of stdout.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// List the transports and workloads.
    List,
}

/// Exit code for bad input (unknown names, bad values).
const USAGE: u8 = 2;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            // One line: clap's first line names the problem (and the valid values where it knows them).
            let text = e.render().to_string();
            eprintln!("{}", text.lines().next().unwrap_or("invalid arguments"));
            return ExitCode::from(USAGE);
        }
    };
    match cli.command {
        Some(Command::Serve(args)) => finish(serve::run(args)),
        Some(Command::Worker(args)) => finish(worker::run(args)),
        Some(Command::Adversary(args)) => finish(adversary::run(args)),
        Some(Command::Report {
            fill: Some(page),
            from,
            check,
            ..
        }) => finish(fill_page(&page, from.as_deref(), check)),
        Some(Command::Report {
            files,
            html,
            markdown,
            svg,
            ..
        }) => finish(report_files(
            &files,
            html.as_deref(),
            markdown.as_deref(),
            svg.as_deref(),
        )),
        Some(Command::Check {
            files,
            baseline,
            tolerance,
            max_reference_spread,
            allow_generator_bound,
            allow_unsaturated,
        }) => {
            let allowed: Vec<&str> = [
                (allow_generator_bound, workloads::trust::GENERATOR_BOUND),
                (allow_unsaturated, workloads::trust::SERVER_UNSATURATED),
            ]
            .into_iter()
            .filter_map(|(on, flag)| on.then_some(flag))
            .collect();
            finish_check(
                &files,
                baseline.as_deref(),
                tolerance,
                max_reference_spread,
                &allowed,
            )
        }
        Some(Command::Compare { a, b, confidence }) => {
            if !(0.5..1.0).contains(&confidence) {
                return usage("--confidence must be at least 0.5 and below 1");
            }
            finish(compare_files(&a, &b, confidence))
        }
        Some(Command::Export { format, files, out }) => {
            finish(export_files(&files, format, out.as_deref()))
        }
        Some(Command::List) => {
            list();
            ExitCode::SUCCESS
        }
        Some(Command::Run(args)) => start_run(args),
        None => start_run(cli.run),
    }
}

fn start_run(args: run::RunArgs) -> ExitCode {
    let transports = match registry::parse_list(&args.transport) {
        Ok(t) => t,
        Err(e) => return usage(&e),
    };
    let chosen = match run::parse_workloads(&args.workload) {
        Ok(w) => w,
        Err(e) => return usage(&e),
    };
    let plan = match run::plan(args.profile, &chosen, &args.params, &args.rtt) {
        Ok(p) => p,
        Err(e) => return usage(&e),
    };
    // Pin before any thread starts, so every thread of the load generator inherits its CPUs.
    let pinning = match pin(args.pin) {
        Ok(p) => p,
        Err(e) => return finish(Err(e)),
    };
    workloads::process::install_cleanup();
    // On one CPU (the load generator pinned beside its server) every task runs on one thread either way: the
    // current-thread scheduler wakes tasks without the multi-thread one's atomics and queues between threads.
    let one_cpu = std::thread::available_parallelism().is_ok_and(|n| n.get() == 1);
    let built = if one_cpu {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
    };
    let runtime = match built {
        Ok(r) => r,
        Err(e) => return finish(Err(e.into())),
    };
    // On the multi-thread scheduler the runs go on a worker thread, beside the links' tasks: the main thread would
    // wake and be woken for every batch of answers, a context switch each.
    let r = runtime.block_on(async {
        tokio::spawn(run::run(args, transports, plan, pinning))
            .await
            .unwrap_or_else(|e| Err(anyhow::anyhow!("the run task failed: {e}")))
    });
    drop(runtime);
    finish(r)
}

/// Place this process (the load generator) on the CPUs the plan gives it; the servers are pinned as they start.
fn pin(setting: run::Pin) -> Result<workloads::pin::Pinning> {
    let plan = match setting {
        run::Pin::Off => workloads::pin::plan(false),
        run::Pin::On => workloads::pin::plan(true),
        run::Pin::Server(cpu) => workloads::pin::plan_server_on(Some(cpu)),
    }
    .context("placing the server and the load generator")?;
    if plan.separate() {
        workloads::pin::pin_this_process(&plan.generator_cpus)
            .context("pinning the load generator")?;
    }
    Ok(plan)
}

fn usage(message: &str) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::from(USAGE)
}

fn finish(r: Result<()>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn report_files(
    files: &[PathBuf],
    html: Option<&Path>,
    markdown: Option<&Path>,
    svg: Option<&Path>,
) -> Result<()> {
    let all = read_all(files)?;
    let tables = report::render(&all);
    match markdown {
        Some(path) => write_file(path, tables.as_bytes())?,
        None if html.is_none() => print!("{tables}"),
        None => {}
    }
    if let Some(path) = html {
        let sources: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
        write_file(path, report::html::render(&all, &sources)?.as_bytes())?;
    }
    if let Some(dir) = svg {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        for chart in chart::all(&all)? {
            write_file(
                &dir.join(format!("{}.svg", chart.name)),
                chart.svg.as_bytes(),
            )?;
        }
    }
    Ok(())
}

/// Refill a page's generated tables, or with `check` fail if they are not what the results give.
fn fill_page(page: &Path, from: Option<&Path>, check: bool) -> Result<()> {
    let text =
        std::fs::read_to_string(page).with_context(|| format!("reading {}", page.display()))?;
    let filled = report::fill::fill(&text, page, from)?;
    if check {
        if filled != text {
            anyhow::bail!(
                "{} is not what its results folder gives: run `runner report --fill {}`",
                page.display(),
                page.display()
            );
        }
        eprintln!(
            "{}: its tables are what its results folder gives",
            page.display()
        );
        return Ok(());
    }
    write_file(page, filled.as_bytes())
}

/// Write a file (its directory created), and say so on stderr.
fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

fn read_all(files: &[PathBuf]) -> Result<Vec<workloads::result::RunResult>> {
    let mut all = Vec::new();
    for f in files {
        all.extend(workloads::result::read(f)?);
    }
    Ok(all)
}

fn finish_check(
    files: &[PathBuf],
    baseline: Option<&Path>,
    tolerance: f64,
    max_spread: Option<f64>,
    allowed: &[&str],
) -> ExitCode {
    if !(0.0..=10.0).contains(&tolerance) {
        return usage("--tolerance must be between 0 and 10");
    }
    if max_spread.is_some_and(|s| !(0.0..=10.0).contains(&s)) {
        return usage("--max-reference-spread must be between 0 and 10");
    }
    let run = || -> Result<bool> {
        let current = read_all(files)?;
        let mut checks = check::invariants_with(&current, allowed);
        if let Some(b) = baseline {
            let base = workloads::result::read(b)?;
            checks.extend(check::against_baseline(
                &current, &base, tolerance, max_spread,
            ));
        }
        println!("{}", check::render(&checks));
        let failed = checks.iter().filter(|c| c.fails()).count();
        eprintln!("{} checks, {failed} failed", checks.len());
        Ok(failed == 0)
    };
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(USAGE)
        }
    }
}

fn compare_files(a: &Path, b: &Path, confidence: f64) -> Result<()> {
    let (ra, rb) = (workloads::result::read(a)?, workloads::result::read(b)?);
    let (rows, notes) = compare::compare(&ra, &rb, confidence);
    if rows.is_empty() {
        anyhow::bail!(
            "nothing to compare: no workload case with the same parameters and transport in both files"
        );
    }
    print!("{}", compare::render(&rows, &notes, confidence));
    Ok(())
}

fn export_files(files: &[PathBuf], format: export::ExportFormat, out: Option<&Path>) -> Result<()> {
    let points = export::points(&read_all(files)?)?;
    let json = serde_json::to_string_pretty(&export::render(&points, format))? + "\n";
    match out {
        Some(path) => write_file(path, json.as_bytes()),
        None => {
            print!("{json}");
            Ok(())
        }
    }
}

fn list() {
    println!("transports:");
    for s in registry::specs() {
        println!("  {:<24} {}", s.name, s.about);
    }
    println!("workloads:");
    for w in workloads::ALL {
        let info = w.info();
        println!("  {:<24} {}", info.name, info.about);
    }
}
