//! Embeds what results record about the build, so that a result names the code that measured it and not whatever
//! the source tree holds when the binary runs: the compiler, the commit, whether the sources it was built from
//! differ from that commit, and the build profile.
//!
//! Outside a git checkout (a source archive) the commit is `unknown`. The script runs again when HEAD moves, the
//! index changes or a source of the workspace changes, so the dirty flag follows the tree the binary is built from.

use std::path::Path;
use std::process::Command;

/// The workspace paths whose contents make the binary: a change under them (tracked or not) makes the build dirty.
const SOURCES: &[&str] = &[
    "Cargo.toml",
    "Cargo.lock",
    "transports",
    "workloads",
    "runner",
];

fn main() {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = output(Command::new(rustc).arg("-V")).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=RUNNER_RUSTC_VERSION={version}");
    println!("cargo:rerun-if-env-changed=RUSTC");

    // The package's directory as cargo gives it to this run, never as it was when the script was compiled: a
    // target directory shared by two checkouts (CARGO_TARGET_DIR) reuses one compiled script for both.
    let manifest = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into());
    let root = Path::new(&manifest).join("..");
    let git = |args: &[&str]| output(Command::new("git").arg("-C").arg(&root).args(args));
    let commit = git(&["rev-parse", "HEAD"]);
    let dirty = match &commit {
        Some(_) => {
            let mut args = vec!["status", "--porcelain", "--"];
            args.extend(SOURCES);
            // A status that cannot be read is not a clean tree.
            git(&args).is_none_or(|s| !s.is_empty())
        }
        None => false,
    };
    println!(
        "cargo:rustc-env=RUNNER_GIT_COMMIT={}",
        commit.as_deref().unwrap_or("unknown")
    );
    println!("cargo:rustc-env=RUNNER_GIT_DIRTY={dirty}");
    println!(
        "cargo:rustc-env=RUNNER_BUILD_PROFILE={}",
        std::env::var("PROFILE").unwrap_or_else(|_| "unknown".into())
    );

    // Run again when HEAD moves (a commit, a checkout), the index changes (an add) or a source changes.
    if commit.is_some() {
        let mut watched = vec!["HEAD".to_string(), "index".into(), "logs/HEAD".into()];
        if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
            watched.push(r);
        }
        for w in watched {
            if let Some(path) = git(&["rev-parse", "--git-path", &w]) {
                let path = if Path::new(&path).is_absolute() {
                    path.into()
                } else {
                    root.join(path)
                };
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }
    }
    for path in watched_sources(&root) {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}

/// What to watch for source changes: the workspace's manifests and each crate's manifest, build script and `src`
/// (not whole crate directories, which hold fuzzing corpora and build output).
fn watched_sources(root: &Path) -> Vec<std::path::PathBuf> {
    let mut crates = vec![root.join("workloads"), root.join("runner")];
    if let Ok(dirs) = std::fs::read_dir(root.join("transports")) {
        crates.extend(dirs.flatten().map(|d| d.path()));
    }
    let mut out = vec![root.join("Cargo.toml"), root.join("Cargo.lock")];
    for c in crates {
        out.extend(["Cargo.toml", "build.rs", "src", "tests"].map(|f| c.join(f)));
    }
    out.retain(|p| p.exists());
    out
}

/// The trimmed standard output of a command that succeeded.
fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}
