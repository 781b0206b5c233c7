//! The regression check, end to end under callgrind: an unchanged build passes, a deliberately slowed one fails.
//!
//! Needs valgrind (Debian: `apt-get install valgrind`). The slowdown is the tool's own (`ICOUNT_SLOWDOWN`, a loop
//! added inside the measured section of the named scenario): nothing in the measured code changes.

use std::path::Path;
use std::process::{Command, Output};

const SCENARIO: &str = "pure/crypto/seal-record";

fn measure(dir: &Path, out: &str, check: Option<&str>, slowdown: Option<&str>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_icount"));
    cmd.args([
        "measure",
        "--only",
        SCENARIO,
        "--iterations",
        "20",
        "--jobs",
        "1",
    ])
    .arg("--out")
    .arg(dir.join(out))
    .arg("--callgrind-dir")
    .arg(dir.join("callgrind"));
    if let Some(base) = check {
        cmd.arg("--check").arg(dir.join(base));
    }
    match slowdown {
        Some(s) => cmd.env("ICOUNT_SLOWDOWN", s),
        None => cmd.env_remove("ICOUNT_SLOWDOWN"),
    };
    cmd.output().expect("running icount")
}

fn text(o: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn an_unchanged_build_passes_and_a_slowed_one_fails() {
    let dir = tempfile::tempdir().unwrap();
    let base = measure(dir.path(), "base.jsonl", None, None);
    assert!(
        base.status.success(),
        "baseline run failed: {}",
        text(&base)
    );

    let same = measure(dir.path(), "same.jsonl", Some("base.jsonl"), None);
    let same_text = text(&same);
    assert!(
        same.status.success(),
        "an unchanged build failed the check: {same_text}"
    );
    // The scenario is deterministic: not merely within the tolerance, identical.
    assert!(
        same_text.contains(&format!("| {SCENARIO} |")),
        "{same_text}"
    );
    assert!(same_text.contains("| +0.00% | ok |"), "{same_text}");

    // Ten turns of a loop (a few instructions each) in a section of about 1,500 instructions: a growth of a few
    // percent, beyond the 1% tolerance.
    let slow = measure(
        dir.path(),
        "slow.jsonl",
        Some("base.jsonl"),
        Some(&format!("{SCENARIO}=10")),
    );
    let slow_text = text(&slow);
    assert_eq!(
        slow.status.code(),
        Some(1),
        "a slowed build passed: {slow_text}"
    );
    assert!(slow_text.contains("**REGRESSED**"), "{slow_text}");
    assert!(
        slow_text.contains(&format!("regressed or not comparable: {SCENARIO}")),
        "{slow_text}"
    );

    // The slowdown applies to the scenario it names only.
    let other = measure(
        dir.path(),
        "other.jsonl",
        Some("base.jsonl"),
        Some("mqtt/=1000"),
    );
    assert!(other.status.success(), "{}", text(&other));
}
