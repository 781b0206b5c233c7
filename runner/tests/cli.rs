//! Bad input gets one clear line on stderr and exit code 2, never a panic.

use std::process::Command;

fn runner(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_runner"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_input_is_one_line_and_exit_2() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--transport", "nope", "--workload", "drain"],
            "pure:plain",
        ),
        (&["--transport", "pure", "--workload", "nope"], "drain"),
        (
            &[
                "--transport",
                "pure",
                "--workload",
                "drain",
                "--profile",
                "huge",
            ],
            "quick",
        ),
        (
            &[
                "--transport",
                "pure",
                "--workload",
                "drain",
                "--rounds",
                "many",
            ],
            "rounds",
        ),
        (
            &[
                "--transport",
                "pure",
                "--workload",
                "drain",
                "--param",
                "nope=1",
            ],
            "orders",
        ),
        (
            &[
                "--transport",
                "pure",
                "--workload",
                "drain",
                "--sync",
                "sometimes",
            ],
            "batch",
        ),
        (&["--transport", "", "--workload", "drain"], "no transport"),
    ];
    for (args, hint) in cases {
        let (code, stdout, stderr) = runner(args);
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert_eq!(
            stderr.trim_end().lines().count(),
            1,
            "{args:?}: one line, got {stderr:?}"
        );
        assert!(
            stderr.contains(hint),
            "{args:?}: {stderr:?} should name {hint}"
        );
        assert!(!stderr.contains("panicked"), "{args:?}");
        assert!(stdout.is_empty(), "{args:?}");
    }
}

#[test]
fn serve_with_a_missing_identity_fails_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let (code, _, stderr) = runner(&[
        "serve",
        "--transport",
        "pure",
        "--identity",
        dir.path().join("missing").to_str().unwrap(),
        "--store",
        dir.path().join("store").to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("node.key"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn list_names_every_pure_variant_and_workload() {
    let (code, stdout, _) = runner(&["list"]);
    assert_eq!(code, 0);
    for name in [
        "pure",
        "pure:no-memo",
        "pure:hpke-session",
        "pure:hpke-per-request",
        "pure:plain",
        "drain",
        "restart",
    ] {
        assert!(stdout.contains(name), "{name}");
    }
}
