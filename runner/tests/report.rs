//! `runner report --html`, `runner compare` and `runner export` through the binary, on real results files: the
//! reference results in baseline-data/ and synthetic rounds written here.
//!
//! The page is opened in a real headless browser (Debian's `chromium`, `apt-get install -y chromium`): the test
//! reads the DOM after the page's script ran and the browser's console log. Without chromium it says so loudly and
//! passes (CI installs it).

use serde_json::json;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn runner(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_runner"))
        .args(args)
        .output()
        .unwrap()
}

/// Every results file of the reference runs (the dated folders of baseline-data/).
fn reference_results() -> Vec<PathBuf> {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("../baseline-data");
    let mut files = Vec::new();
    for dir in std::fs::read_dir(&base).unwrap() {
        let dir = dir.unwrap().path();
        let dated = dir
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(|c: char| c.is_ascii_digit()));
        if !dir.is_dir() || !dated {
            continue;
        }
        for f in std::fs::read_dir(&dir).unwrap() {
            let f = f.unwrap().path();
            if f.extension().is_some_and(|e| e == "jsonl") {
                files.push(f);
            }
        }
    }
    files.sort();
    assert!(
        !files.is_empty(),
        "no reference results under {}",
        base.display()
    );
    files
}

/// What the browser made of a page: the body's `data-charts` and every console line it logged.
struct Rendered {
    marker: String,
    console: Vec<String>,
}

/// Open a page in headless chromium and dump its DOM after scripts ran; `None` when there is no chromium.
fn open_in_chromium(page: &Path) -> Option<Rendered> {
    if Command::new("chromium")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_or(true, |s| !s.success())
    {
        // Straight to the process's stderr, past the test harness's capture, so that CI logs show it.
        let _ = writeln!(
            std::io::stderr(),
            "\n{0}\n## chromium is not installed: the browser check of the HTML report is ##\n\
             ## SKIPPED. Install it with: apt-get install -y chromium              ##\n{0}\n",
            "#".repeat(72)
        );
        return None;
    }
    let profile = tempfile::tempdir().unwrap();
    let page = std::fs::canonicalize(page).unwrap();
    let mut child = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg("--dump-dom")
        .arg(format!("file://{}", page.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Read both pipes on threads so a chatty browser never blocks on a full pipe.
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut s).unwrap();
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut stderr, &mut s).unwrap();
        s
    });
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium did not finish within 120 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let dom = out.join().unwrap();
    let log = err.join().unwrap();
    let body = dom
        .split("<body")
        .nth(1)
        .and_then(|b| b.split_once('>'))
        .map(|(attrs, _)| attrs.to_string())
        .unwrap_or_default();
    let marker = body
        .split("data-charts=\"")
        .nth(1)
        .and_then(|m| m.split_once('"'))
        .map(|(m, _)| m.to_string())
        .unwrap_or_default();
    let console = log
        .lines()
        .filter(|l| l.contains("CONSOLE") || l.contains("Uncaught"))
        .map(str::to_string)
        .collect();
    Some(Rendered { marker, console })
}

#[test]
fn the_html_report_of_the_reference_results_renders_every_chart() {
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("report.html");
    let files = reference_results();
    let mut args = vec!["report", "--html", page.to_str().unwrap()];
    args.extend(files.iter().map(|f| f.to_str().unwrap()));
    let out = runner(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let html = std::fs::read_to_string(&page).unwrap();

    // Self-contained: no script, style, image or font from elsewhere; the only address is SVG's namespace.
    for banned in ["<script src", "<link", "<img", "<iframe", "@import", "url("] {
        assert!(!html.contains(banned), "the page loads something: {banned}");
    }
    let addresses = html.matches("http://").count() + html.matches("https://").count();
    let namespaces = html.matches("http://www.w3.org/2000/svg").count();
    assert_eq!(
        addresses, namespaces,
        "only the SVG namespace may be an address"
    );

    // Every workload of the reference results has its section, its tables and its checks; the charts the issue
    // names are there.
    for w in [
        "drain",
        "restart",
        "first-contact",
        "handshake-rate",
        "idle-links",
    ] {
        assert!(html.contains(&format!("<section id=\"{w}\">")), "{w}");
    }
    let charts = html.matches("<figure class=\"chart\"").count();
    for id in [
        "chart-restart-timeline",
        "chart-first-contact-sweep",
        "chart-handshake-rate-sweep",
        "chart-idle-links-sweep",
        "chart-drain-cases",
        "chart-restart-make-to-stored",
    ] {
        assert!(html.contains(&format!("id=\"{id}\"")), "missing {id}");
    }
    assert!(html.contains("<h3>Checks</h3>") && html.contains("<h3>Provenance</h3>"));
    assert!(
        html.contains("<dt>commit</dt>"),
        "provenance names the commit"
    );
    assert!(
        html.contains("<tr class=\"seed\"><td>seed 095: Pure, memo</td>"),
        "the seed's reference rows beside the seed-profile restart"
    );
    assert!(
        html.contains("<tr class=\"untrusted\">") && html.contains("generator-bound"),
        "the generator-bound handshake runs are marked"
    );

    let Some(rendered) = open_in_chromium(&page) else {
        return;
    };
    assert_eq!(
        rendered.marker,
        format!("ok {charts}"),
        "every chart rendered; console: {:?}",
        rendered.console
    );
    assert!(charts >= 15, "{charts} charts");
    assert!(
        rendered.console.is_empty(),
        "the browser logged: {:?}",
        rendered.console
    );
}

#[test]
fn the_browser_check_catches_a_missing_chart_and_a_script_error() {
    // The same check, on a page whose second chart has no SVG and whose script throws: the test above would fail.
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.html");
    let out = runner(&[
        "report",
        "--html",
        good.to_str().unwrap(),
        reference_results()
            .iter()
            .find(|f| f.ends_with("drain.jsonl"))
            .unwrap()
            .to_str()
            .unwrap(),
    ]);
    assert!(out.status.success());
    let html = std::fs::read_to_string(&good).unwrap();
    let broken = html
        .replacen(
            "<h3>Charts</h3>",
            "<h3>Charts</h3>\n<figure class=\"chart\" id=\"chart-empty\"><p>no picture</p></figure>\n<script>undefinedFunction();</script>",
            1,
        );
    let bad = dir.path().join("broken.html");
    std::fs::write(&bad, broken).unwrap();
    let Some(rendered) = open_in_chromium(&bad) else {
        return;
    };
    assert!(
        rendered.marker.starts_with("failed: chart-empty"),
        "{}",
        rendered.marker
    );
    let log = rendered.console.join("\n");
    assert!(log.contains("Uncaught"), "{log}");
    assert!(log.contains("charts not rendered"), "{log}");
}

/// A drain result line with the given rate.
fn drain(transport: &str, round: u32, rate: f64) -> serde_json::Value {
    json!({
        "schema": 1, "workload": "drain", "transport": transport, "round": round,
        "params": {"orders": 1000, "clients": 8, "payload_bytes": 64, "pile_up_ms": 300, "timeout_s": 60},
        "metrics": {"orders_per_second": rate, "server_cpu_us_per_order": 1_000_000.0 / rate, "lost": 0,
                    "duplicates": 0, "unanswered": 0, "timed_out": 0},
        "histograms": {}, "provenance": {"commit": "abc", "profile": "quick"},
        "durability": {"sync": "batch", "store_fs": "ext4", "server_threads": 1}
    })
}

fn write_lines(path: &Path, lines: &[serde_json::Value]) {
    let text: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    std::fs::write(path, text.join("\n") + "\n").unwrap();
}

#[test]
fn compare_tells_a_slower_transport_from_noise() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.jsonl"), dir.path().join("b.jsonl"));
    // plain: the same spread both times; sealed: 30% slower in every round of B.
    let mut la = Vec::new();
    let mut lb = Vec::new();
    for (round, noise) in [(0, 1.0), (1, 1.03), (2, 0.97)] {
        la.push(drain("pure:plain", round, 100_000.0 * noise));
        lb.push(drain("pure:plain", round, 100_000.0 * (2.0 - noise)));
        la.push(drain("pure:hpke-session", round, 90_000.0 * noise));
        lb.push(drain("pure:hpke-session", round, 63_000.0 * noise));
    }
    write_lines(&a, &la);
    write_lines(&b, &lb);
    let out = runner(&["compare", a.to_str().unwrap(), b.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    // The cells of the row of a transport and metric.
    let row = |transport: &str, metric: &str| -> Vec<String> {
        text.lines()
            .map(|l| {
                l.split('|')
                    .map(|c| c.trim().to_string())
                    .collect::<Vec<_>>()
            })
            .find(|cells| cells.iter().any(|c| c == transport) && cells.iter().any(|c| c == metric))
            .unwrap_or_else(|| panic!("no row for {transport} {metric} in\n{text}"))
    };
    // | case | metric | transport | A | B | change | interval | confidence | verdict |
    let sealed = row("pure:hpke-session", "orders_per_second");
    assert_eq!(
        (sealed[6].as_str(), sealed[9].as_str()),
        ("-30.0%", "worse"),
        "{sealed:?}"
    );
    assert_eq!(sealed[8], "90%", "3 rounds against 3 allow 90%: {sealed:?}");
    let cpu = row("pure:hpke-session", "server_cpu_us_per_order");
    assert_eq!(cpu[9], "worse", "more CPU per order is worse: {cpu:?}");
    let plain = row("pure:plain", "orders_per_second");
    assert_eq!(plain[9], "no change", "{plain:?}");

    // Nothing in common: one clear error.
    let c = dir.path().join("c.jsonl");
    write_lines(
        &c,
        &[
            json!({"schema": 1, "workload": "drain", "transport": "quinn", "round": 0,
        "params": {"orders": 5}, "metrics": {"orders_per_second": 1.0}, "histograms": {}, "provenance": {}}),
        ],
    );
    let out = runner(&["compare", a.to_str().unwrap(), c.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nothing to compare"));
    let out = runner(&[
        "compare",
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        "--confidence",
        "2",
    ]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn export_writes_what_dashboards_read() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.jsonl");
    write_lines(
        &a,
        &[
            drain("pure:plain", 0, 100.0),
            drain("pure:plain", 1, 120.0),
            drain("pure:plain", 2, 110.0),
        ],
    );
    let json_of = |format: &str| -> serde_json::Value {
        let out = runner(&["export", "--format", format, a.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let bigger = json_of("github-bigger");
    let entry = &bigger.as_array().unwrap()[0];
    assert_eq!(entry["name"], "drain / pure:plain / orders_per_second");
    assert_eq!(
        (entry["value"].as_f64(), entry["unit"].as_str()),
        (Some(110.0), Some("orders/s"))
    );
    assert_eq!(entry["range"], "± 10");
    let smaller = json_of("github-smaller");
    assert!(smaller
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["name"] == "drain / pure:plain / server_cpu_us_per_order"));
    let bmf = json_of("bencher");
    let m = &bmf["drain / pure:plain"]["orders_per_second"];
    assert_eq!(
        (
            m["value"].as_f64(),
            m["lower_value"].as_f64(),
            m["upper_value"].as_f64()
        ),
        (Some(110.0), Some(100.0), Some(120.0))
    );

    // Into a file; a bad format is a usage error.
    let file = dir.path().join("out/bmf.json");
    let out = runner(&[
        "export",
        "--format",
        "bencher",
        "--out",
        file.to_str().unwrap(),
        a.to_str().unwrap(),
    ]);
    assert!(out.status.success());
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(written, bmf);
    let out = runner(&["export", "--format", "nope", a.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn report_writes_markdown_and_svg_files() {
    let dir = tempfile::tempdir().unwrap();
    let md = dir.path().join("tables.md");
    let svg = dir.path().join("charts");
    let restart = reference_results()
        .into_iter()
        .find(|f| f.ends_with("restart.jsonl"))
        .unwrap();
    let out = runner(&[
        "report",
        "--markdown",
        md.to_str().unwrap(),
        "--svg",
        svg.to_str().unwrap(),
        restart.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stdout.is_empty(), "the tables went to the file");
    let tables = std::fs::read_to_string(&md).unwrap();
    assert!(
        tables.contains("### restart") && tables.contains("| seed 095: quinn"),
        "{tables}"
    );
    let timeline = std::fs::read_to_string(svg.join("restart-timeline.svg")).unwrap();
    assert!(timeline.starts_with("<svg") && timeline.contains("kill"));
}

#[test]
fn fill_renews_the_tables_of_a_page_and_keeps_its_commentary() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    write_lines(
        &data.join("drain.jsonl"),
        &[drain("plain", 0, 1000.0), drain("sealed", 0, 800.0)],
    );
    let docs = dir.path().join("docs");
    std::fs::create_dir_all(&docs).unwrap();
    let page = docs.join("results.md");
    let stale = "# Results\n\nOur words.\n\n<!-- report drain.jsonl -->\n| typed by hand | 1 |\n<!-- end report -->\n\nMore words.\n";
    std::fs::write(&page, stale).unwrap();
    let p = page.to_str().unwrap();

    // No folder named yet: a clear line, exit 1.
    let out = runner(&["report", "--fill", p, "--check"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no `<!-- results from DIR -->` line"));

    let out = runner(&["report", "--fill", p, "--from", data.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let filled = std::fs::read_to_string(&page).unwrap();
    assert!(filled.contains("Our words.") && filled.contains("More words."));
    assert!(!filled.contains("typed by hand"));
    assert!(
        filled.contains("### drain") && filled.contains("| plain"),
        "{filled}"
    );
    assert!(
        filled.starts_with("<!-- results from "),
        "the page names its folder"
    );
    // Filled, the page passes --check; with a table edited by hand it fails, and says how to renew it.
    let out = runner(&["report", "--fill", p, "--check"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(&page, filled.replace("| plain", "| plane")).unwrap();
    let out = runner(&["report", "--fill", p, "--check"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("runner report --fill"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn generated_pages_hold_exactly_what_their_results_folder_gives() {
    for page in ["results.md", "security.md"] {
        let page = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../docs")
            .join(page);
        let out = runner(&["report", "--fill", page.to_str().unwrap(), "--check"]);
        assert!(
            out.status.success(),
            "{}'s tables are generated (docs/report.md, \"Generated pages\"): {}",
            page.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
