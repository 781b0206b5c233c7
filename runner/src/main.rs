//! `runner`: benchmark network transports side by side.
//!
//! `runner --transport pure,quinn --workload restart` runs workloads (the default subcommand); `runner serve` runs
//! the server side of one transport (the runner starts it as a child process); `runner report` renders tables from
//! results files; `runner list` names the transports and workloads.

mod chart;
mod check;
mod provenance;
mod registry;
mod report;
mod run;
mod serve;

use anyhow::Result;
use clap::{Parser, Subcommand};
use std::path::PathBuf;
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
    /// Render the tables of results files.
    Report {
        /// JSON Lines results files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Also write charts (SVG) into this directory: the restart timeline.
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
    },
    /// Compare the medians of two results files.
    Compare {
        /// The earlier results.
        a: PathBuf,
        /// The later results.
        b: PathBuf,
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
        Some(Command::Report { files, svg }) => finish(report_files(&files, svg.as_deref())),
        Some(Command::Check {
            files,
            baseline,
            tolerance,
        }) => finish_check(&files, baseline.as_deref(), tolerance),
        Some(Command::Compare { a, b }) => finish(compare_files(&a, &b)),
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
    workloads::process::install_cleanup();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return finish(Err(e.into())),
    };
    let r = runtime.block_on(run::run(args, transports, plan));
    drop(runtime);
    finish(r)
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

fn report_files(files: &[PathBuf], svg: Option<&std::path::Path>) -> Result<()> {
    let all = read_all(files)?;
    print!("{}", report::render(&all));
    if let Some(dir) = svg {
        std::fs::create_dir_all(dir)?;
        if let Some(chart) = chart::restart_timeline(&all) {
            let path = dir.join("restart-timeline.svg");
            std::fs::write(&path, chart)?;
            eprintln!("wrote {}", path.display());
        }
    }
    Ok(())
}

fn read_all(files: &[PathBuf]) -> Result<Vec<workloads::result::RunResult>> {
    let mut all = Vec::new();
    for f in files {
        all.extend(workloads::result::read(f)?);
    }
    Ok(all)
}

fn finish_check(files: &[PathBuf], baseline: Option<&std::path::Path>, tolerance: f64) -> ExitCode {
    if !(0.0..=10.0).contains(&tolerance) {
        return usage("--tolerance must be between 0 and 10");
    }
    let run = || -> Result<bool> {
        let current = read_all(files)?;
        let mut checks = check::invariants(&current);
        if let Some(b) = baseline {
            let base = workloads::result::read(b)?;
            checks.extend(check::against_baseline(&current, &base, tolerance));
        }
        println!("{}", check::render(&checks));
        let failed = checks.iter().filter(|c| !c.ok).count();
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

fn compare_files(a: &std::path::Path, b: &std::path::Path) -> Result<()> {
    let (ra, rb) = (workloads::result::read(a)?, workloads::result::read(b)?);
    println!("{}", check::compare(&ra, &rb));
    Ok(())
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
