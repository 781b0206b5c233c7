//! Running one scenario under callgrind and reading its count.
//!
//! The scenario runs in a child process, `valgrind --tool=callgrind` on this same binary's `run` subcommand, with
//! collection off at start and toggled on only inside the measured section ([`SECTION_SYMBOL`]); cache and branch
//! simulation are off (only instructions are wanted). Where `setarch -R` works the child also runs without address
//! space randomisation, so the addresses a hash or an allocator sees do not differ between runs.
//! The count is the `totals:` line (or `summary:`) of the output file: instructions executed by the process
//! while collection was on, user space only.

use crate::meter::SECTION_SYMBOL;
use anyhow::{bail, Context};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// `valgrind --version`, e.g. `valgrind-3.19.0`.
pub fn valgrind_version() -> anyhow::Result<String> {
    let out = Command::new("valgrind")
        .arg("--version")
        .output()
        .context("valgrind is not installed (Debian: apt-get install valgrind)")?;
    if !out.status.success() {
        bail!("valgrind --version failed: {}", out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The CPU features this binary sees under valgrind (`exe cpu-features` run with `--tool=none`). Valgrind shows a
/// program fewer features than the host has (no ADX, SHA or VAES in 3.19, for instance), and the libraries choose
/// their code paths from what they see: this, not the host's model name, says whether two counts are comparable.
pub fn guest_cpu_features(exe: &Path) -> anyhow::Result<String> {
    let out = Command::new("valgrind")
        .args(["-q", "--tool=none"])
        .arg(exe)
        .arg("cpu-features")
        .stdin(Stdio::null())
        .output()
        .context("starting valgrind")?;
    if !out.status.success() {
        bail!(
            "reading the CPU features under valgrind failed: {}",
            out.status
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The features of the running CPU that the measured libraries switch on (AES-GCM, GHASH, SHA-2, P-256, X25519,
/// memcpy), comma-separated.
pub fn cpu_features() -> String {
    #[cfg(target_arch = "x86_64")]
    {
        let mut seen = Vec::new();
        macro_rules! detect {
            ($($f:tt),*) => { $( if std::arch::is_x86_feature_detected!($f) { seen.push($f); } )* };
        }
        detect!(
            "aes",
            "pclmulqdq",
            "sse4.1",
            "sse4.2",
            "avx",
            "avx2",
            "fma",
            "bmi1",
            "bmi2",
            "adx",
            "sha",
            "vaes",
            "vpclmulqdq",
            "avx512f",
            "avx512ifma",
            "movbe"
        );
        seen.join(",")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        std::env::consts::ARCH.to_string()
    }
}

/// Runs scenarios of one executable under callgrind, keeping the output and log files in one directory.
#[derive(Debug, Clone)]
pub struct Callgrind {
    exe: PathBuf,
    dir: PathBuf,
    no_aslr: bool,
}

impl Callgrind {
    /// Scenarios of `exe` (this tool's binary), output files in `dir`.
    pub fn new(exe: PathBuf, dir: PathBuf) -> anyhow::Result<Callgrind> {
        valgrind_version()?;
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let no_aslr = Command::new("setarch")
            .args(["-R", "true"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        Ok(Callgrind { exe, dir, no_aslr })
    }

    /// Whether the children run without address space randomisation.
    pub fn no_aslr(&self) -> bool {
        self.no_aslr
    }

    /// The callgrind output file of a scenario.
    pub fn output_file(&self, scenario: &str) -> PathBuf {
        self.dir.join(format!("{}.callgrind", file_stem(scenario)))
    }

    /// Run `scenario` for `iterations` counted steps; the instructions counted in all.
    pub fn count(&self, scenario: &str, iterations: u64) -> anyhow::Result<u64> {
        let out = self.output_file(scenario);
        let log = self.dir.join(format!("{}.log", file_stem(scenario)));
        let mut cmd = if self.no_aslr {
            let mut c = Command::new("setarch");
            c.args(["-R", "valgrind"]);
            c
        } else {
            Command::new("valgrind")
        };
        let status = cmd
            .arg("--tool=callgrind")
            .arg("--collect-atstart=no")
            .arg(format!("--toggle-collect={SECTION_SYMBOL}"))
            .arg("--cache-sim=no")
            .arg("--branch-sim=no")
            .arg(format!("--callgrind-out-file={}", out.display()))
            .arg(format!("--log-file={}", log.display()))
            .arg(&self.exe)
            .args(["run", scenario, "--iterations", &iterations.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .status()
            .context("starting valgrind")?;
        if !status.success() {
            bail!(
                "{scenario}: the run under callgrind failed ({status}); callgrind's log: {}",
                log.display()
            );
        }
        read_totals(&out)
    }
}

/// A file name for a scenario (`pure/sender/pure:plain` → `pure_sender_pure-plain`).
fn file_stem(scenario: &str) -> String {
    scenario
        .chars()
        .map(|c| match c {
            '/' => '_',
            c if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' => c,
            _ => '-',
        })
        .collect()
}

/// The instruction total of a callgrind output file; an error if nothing was counted (the measured section never
/// ran, or its symbol was not found).
pub fn read_totals(path: &Path) -> anyhow::Result<u64> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    match parse_totals(&text) {
        Some(0) => bail!(
            "{}: nothing was counted (is `{SECTION_SYMBOL}` in the binary?)",
            path.display()
        ),
        Some(n) => Ok(n),
        None => bail!("{}: no totals: or summary: line", path.display()),
    }
}

/// The first number of the `totals:` line, or of the `summary:` line if there is none.
pub fn parse_totals(text: &str) -> Option<u64> {
    let line = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
    };
    line("totals:").or_else(|| line("summary:"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_are_read_from_either_line() {
        let out = "version: 1\ncreator: callgrind-3.19.0\nevents: Ir\nfn=(1) x\n5 10\nsummary: 1234\n\ntotals: 1234\n";
        assert_eq!(parse_totals(out), Some(1234));
        assert_eq!(parse_totals("events: Ir\nsummary: 99\n"), Some(99));
        assert_eq!(parse_totals("events: Ir\n"), None);
        assert_eq!(parse_totals("totals: lots\n"), None);
    }

    #[test]
    fn file_stems_are_plain() {
        assert_eq!(
            file_stem("pure/sender/pure:plain"),
            "pure_sender_pure-plain"
        );
        assert_eq!(
            file_stem("tls/handshake/rustls/server"),
            "tls_handshake_rustls_server"
        );
    }
}
