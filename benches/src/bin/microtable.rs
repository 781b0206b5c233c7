//! `microtable`: prints the microbenchmark tables in Markdown from criterion's saved results.
//!
//!     cargo bench -p microbench                      # results saved as baseline `new`
//!     cargo run -p microbench --bin microtable       # the seed-style table and the HPKE/AEAD tables
//!     cargo bench -p microbench -- --save-baseline main
//!     cargo run -p microbench --bin microtable -- --compare main new

use anyhow::Result;
use clap::{Parser, ValueEnum};
use microbench::estimates::{self, Statistic};
use microbench::{speed, table};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Parser)]
#[command(about = "Markdown tables from the microbench criterion results")]
struct Opt {
    /// Where criterion saved its results [default: $CARGO_TARGET_DIR/criterion, else target/criterion]
    #[arg(long)]
    criterion_dir: Option<PathBuf>,
    /// The saved baseline to tabulate (`new` is the last `cargo bench`); `a,b,c` takes each benchmark's fastest
    /// of those runs (on a shared machine other work only adds time)
    #[arg(long, default_value = "new", conflicts_with = "compare")]
    baseline: String,
    /// Compare two saved baselines (each may be `a,b` as for --baseline): change and whether the confidence
    /// intervals overlap
    #[arg(long, num_args = 2, value_names = ["BASE", "NEW"])]
    compare: Option<Vec<String>>,
    /// The statistic shown
    #[arg(long, value_enum, default_value_t = Stat::Median)]
    stat: Stat,
    /// Add a column from `openssl speed` (run now, about 4 s; skipped with a note if it cannot run)
    #[arg(long)]
    openssl_speed: bool,
    /// Add a column from saved `openssl speed` output instead of running it
    #[arg(long, value_name = "FILE", conflicts_with = "openssl_speed")]
    openssl_speed_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Stat {
    Median,
    Mean,
}

fn main() -> ExitCode {
    let opt = Opt::parse();
    match run(opt) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("microtable: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(opt: Opt) -> Result<()> {
    let dir = opt.criterion_dir.unwrap_or_else(|| {
        std::env::var_os("CARGO_TARGET_DIR")
            .map_or_else(|| PathBuf::from("target"), PathBuf::from)
            .join("criterion")
    });
    let statistic = match opt.stat {
        Stat::Median => Statistic::Median,
        Stat::Mean => Statistic::Mean,
    };
    let speed = if let Some(path) = &opt.openssl_speed_file {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
        Some(speed::parse(&text))
    } else if opt.openssl_speed {
        match speed::run() {
            Ok(speed) => Some(speed),
            Err(reason) => {
                eprintln!("microtable: no openssl speed column: {reason}");
                None
            }
        }
    } else {
        None
    };

    let (shown, compare) = match &opt.compare {
        Some(names) => (names[1].clone(), Some((names[0].clone(), names[1].clone()))),
        None => (opt.baseline.clone(), None),
    };
    let load = |names: &str| -> Result<Vec<estimates::Measurement>> {
        let runs = names
            .split(',')
            .map(|name| estimates::load(&dir, name.trim()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(estimates::fastest_of(runs, statistic))
    };
    let results = load(&shown)?;
    let base = compare.as_ref().map(|(base, _)| load(base)).transpose()?;

    let source = if shown.contains(',') {
        format!("the fastest of baselines `{shown}`")
    } else {
        format!("baseline `{shown}`")
    };
    println!(
        "Microseconds per operation: criterion {}, {source} ({}).\n",
        statistic.name(),
        dir.display()
    );
    if let Some(seed) = table::seed_table(&results, statistic, speed.as_ref()) {
        println!("### P-256, X25519 and the handshake estimate\n\n{seed}");
        println!(
            "The RustCrypto column is RustCrypto `p256` for P-256 and x25519-dalek for X25519; the \
             handshake's RustCrypto backend uses both.\n"
        );
    }
    for (area, t) in table::area_tables(&results, statistic) {
        println!("### {area}\n\n{t}");
    }
    if let (Some(base), Some((base_name, new_name))) = (base, compare) {
        println!(
            "### `{base_name}` → `{new_name}` ({}; \"no change\" when the 95% intervals overlap)\n",
            statistic.name()
        );
        println!(
            "{}",
            table::compare_table(&base, &results, (&base_name, &new_name), statistic)
        );
    }
    Ok(())
}
