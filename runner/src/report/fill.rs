//! Generated tables inside a hand-written page: `runner report --fill docs/results.md`.
//!
//! The page names the one results folder its tables come from, and marks where each table goes; the commentary
//! around the marks is the page's own and is kept as it is. Filling replaces what lies between each pair of marks
//! with the tables `runner report` renders from that folder, so the numbers on the page are never typed by hand and
//! `--check` can prove they are still what the folder gives.
//!
//! ```text
//! <!-- results from ../baseline-data/2026-12-03 -->         the folder, relative to the page
//! <!-- report drain.jsonl -->                               every workload in one file of it
//! (generated)
//! <!-- end report -->
//! <!-- report pubsub.jsonl workload=fanout -->              one workload of a file
//! <!-- end report -->
//! <!-- report provenance -->                                a row per file: invocations, build, runs, doubts
//! <!-- end report -->
//! <!-- report amdahl.md -->                                  a Markdown file of the folder, as it is
//! <!-- end report -->
//! ```

use anyhow::{anyhow, Context, Result};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use workloads::result::RunResult;

/// The line that names the folder.
const FOLDER_MARK: &str = "<!-- results from ";
/// The start of a generated block.
const BLOCK_MARK: &str = "<!-- report ";
/// The end of a generated block.
const END_MARK: &str = "<!-- end report -->";

/// What one block shows.
#[derive(Debug, PartialEq)]
enum Block {
    /// The tables of one file's results, of one workload or of all.
    Tables {
        file: String,
        workload: Option<String>,
    },
    /// A row per results file of the folder.
    Provenance,
    /// A Markdown file of the folder (a table a script made from the results), included as it is.
    Include(String),
}

fn parse_block(rest: &str) -> Result<Block, String> {
    let body = rest
        .strip_suffix("-->")
        .ok_or("a mark ends with -->")?
        .trim();
    let mut words = body.split_whitespace();
    let first = words
        .next()
        .ok_or("a report mark names a file or `provenance`")?;
    if first == "provenance" {
        return match words.next() {
            None => Ok(Block::Provenance),
            Some(w) => Err(format!("`provenance` takes nothing, not `{w}`")),
        };
    }
    if first.contains('/') || !(first.ends_with(".jsonl") || first.ends_with(".md")) {
        return Err(format!(
            "`{first}`: a report mark names a .jsonl or .md file of the folder, without a directory"
        ));
    }
    if first.ends_with(".md") {
        return match words.next() {
            None => Ok(Block::Include(first.to_string())),
            Some(w) => Err(format!("`{first}` is included as it is: no `{w}`")),
        };
    }
    let mut workload = None;
    for w in words {
        match w.strip_prefix("workload=") {
            Some(name) if workloads::by_name(name).is_some() => workload = Some(name.to_string()),
            Some(name) => return Err(format!("unknown workload `{name}`")),
            None => return Err(format!("`{w}`: the only option is workload=NAME")),
        }
    }
    Ok(Block::Tables {
        file: first.to_string(),
        workload,
    })
}

/// The page with every block filled from `folder` (or from the folder the page names), and the folder used.
///
/// `page_path` locates the page (the folder is relative to it) and names it in errors.
pub fn fill(page: &str, page_path: &Path, folder: Option<&Path>) -> Result<String> {
    let name = page_path.display().to_string();
    let bad = |line: usize, why: String| anyhow!("{name}:{}: {why}", line + 1);
    let base = page_path.parent().unwrap_or(Path::new(""));
    let named = page
        .lines()
        .find_map(|l| l.trim().strip_prefix(FOLDER_MARK))
        .map(|rest| rest.trim_end_matches("-->").trim().to_string());
    // A folder given on the command line is written into the page, relative to it.
    let folder_text = match folder {
        Some(f) => relative_to(f, base),
        None => named.ok_or_else(|| {
            anyhow!("{name}: no `<!-- results from DIR -->` line, and no --from DIR")
        })?,
    };
    let dir = base.join(&folder_text);

    let mut out = String::with_capacity(page.len());
    let mut lines = page.lines().enumerate();
    let mut saw_folder = false;
    while let Some((i, line)) = lines.next() {
        let t = line.trim();
        if t.starts_with(FOLDER_MARK) {
            saw_folder = true;
            let _ = writeln!(out, "{FOLDER_MARK}{folder_text} -->");
            continue;
        }
        if t == END_MARK {
            return Err(bad(i, "an end mark without its report mark".into()));
        }
        let Some(rest) = t.strip_prefix(BLOCK_MARK) else {
            out.push_str(line);
            out.push('\n');
            continue;
        };
        let block = parse_block(rest).map_err(|why| bad(i, why))?;
        // Skip what the block held, up to its end mark.
        let mut closed = false;
        for (j, l) in lines.by_ref() {
            match l.trim() {
                END_MARK => {
                    closed = true;
                    break;
                }
                t if t.starts_with(BLOCK_MARK) || t.starts_with(FOLDER_MARK) => {
                    return Err(bad(j, format!("a mark inside the block of line {}", i + 1)))
                }
                _ => {}
            }
        }
        if !closed {
            return Err(bad(i, "a report mark without `<!-- end report -->`".into()));
        }
        out.push_str(line);
        out.push_str("\n\n");
        out.push_str(render_block(&block, &dir)?.trim_end());
        out.push_str("\n\n");
        out.push_str(END_MARK);
        out.push('\n');
    }
    if !saw_folder {
        // The folder goes at the top, so that the page says where its numbers come from.
        out = format!("{FOLDER_MARK}{folder_text} -->\n{out}");
    }
    Ok(out)
}

fn render_block(block: &Block, dir: &Path) -> Result<String> {
    match block {
        Block::Tables { file, workload } => {
            let results = workloads::result::read(&dir.join(file))?;
            let mut order: Vec<&str> = Vec::new();
            for r in &results {
                let w = r.workload.as_str();
                if !order.contains(&w) && workload.as_deref().is_none_or(|only| only == w) {
                    order.push(w);
                }
            }
            let mut out = String::new();
            for w in order {
                let runs: Vec<&RunResult> = results.iter().filter(|r| r.workload == w).collect();
                out.push_str(&super::render_workload(w, &runs));
                out.push('\n');
            }
            if workload.is_none() {
                out.push_str(&crate::hostile::tables(&results));
            }
            Ok(out)
        }
        Block::Provenance => provenance(dir),
        Block::Include(file) => {
            let path = dir.join(file);
            std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
        }
    }
}

/// A row per results file of the folder: its workloads, invocations, build, when, and how many runs are in doubt.
fn provenance(dir: &Path) -> Result<String> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading the folder {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    files.sort();
    let mut out = String::from(
        "| file | workloads | invocation | build | dates (UTC) | runs | not to be trusted |\n|---|---|---|---|---|---:|---:|\n",
    );
    for f in files {
        let results = workloads::result::read(&f)?;
        let distinct = |get: &dyn Fn(&RunResult) -> String| {
            let mut v: Vec<String> = results.iter().map(get).collect();
            v.sort();
            v.dedup();
            v.join(", ")
        };
        let workloads = {
            let mut v: Vec<&str> = Vec::new();
            for r in &results {
                if !v.contains(&r.workload.as_str()) {
                    v.push(&r.workload);
                }
            }
            v.join(", ")
        };
        let build = distinct(&|r| {
            let p = &r.provenance;
            format!(
                "`{}`{} {}",
                &p.commit[..p.commit.len().min(12)],
                if p.dirty { " (dirty)" } else { "" },
                p.build_profile
            )
        });
        let dates = {
            let mut d: Vec<&str> = results.iter().map(|r| r.provenance.date.as_str()).collect();
            d.sort();
            match (d.first(), d.last()) {
                (Some(a), Some(b)) if a != b => format!("{} to {}", short_date(a), short_date(b)),
                (Some(a), _) => short_date(a).to_string(),
                _ => String::new(),
            }
        };
        let ran: Vec<&RunResult> = results.iter().filter(|r| r.skipped.is_none()).collect();
        let doubtful = ran.iter().filter(|r| !workloads::trust::trusted(r)).count();
        let _ = writeln!(
            out,
            "| `{}` | {workloads} | {} | {build} | {dates} | {} | {doubtful} |",
            f.file_name().unwrap_or_default().to_string_lossy(),
            distinct(&|r| format!("`{}`", r.provenance.invocation)),
            ran.len()
        );
    }
    Ok(out)
}

/// `2026-12-03T04:05:06Z` as `2026-12-03 04:05`.
fn short_date(date: &str) -> &str {
    date.get(..16).unwrap_or(date)
}

/// `folder` as the page should name it: relative to the page's directory where both are relative paths.
fn relative_to(folder: &Path, base: &Path) -> String {
    if folder.is_absolute() || base.as_os_str().is_empty() {
        return folder.display().to_string();
    }
    let ups = base.components().count();
    let mut p = PathBuf::new();
    for _ in 0..ups {
        p.push("..");
    }
    p.push(folder);
    p.display().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_are_read_strictly() {
        assert_eq!(parse_block("provenance -->"), Ok(Block::Provenance));
        assert_eq!(
            parse_block("pubsub.jsonl workload=fanout -->"),
            Ok(Block::Tables {
                file: "pubsub.jsonl".into(),
                workload: Some("fanout".into())
            })
        );
        assert!(parse_block("pubsub.jsonl workload=nope -->").is_err());
        assert_eq!(
            parse_block("amdahl.md -->"),
            Ok(Block::Include("amdahl.md".into()))
        );
        assert!(parse_block("amdahl.md workload=drain -->").is_err());
        assert!(parse_block("notes.txt -->").is_err());
        assert!(parse_block("../x.jsonl -->").is_err());
        assert!(parse_block("drain.jsonl").is_err());
        assert!(parse_block("-->").is_err());
    }

    #[test]
    fn a_block_without_its_end_is_refused_and_commentary_is_kept() {
        let dir = std::env::temp_dir().join(format!("fill-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let page = dir.join("page.md");
        let unclosed = "<!-- results from . -->\ntext\n<!-- report provenance -->\nold\n";
        let e = fill(unclosed, &page, None).unwrap_err().to_string();
        assert!(e.contains("page.md:3"), "{e}");
        let stray = "<!-- results from . -->\n<!-- end report -->\n";
        assert!(fill(stray, &page, None).is_err());
        let e = fill("no folder\n", &page, None).unwrap_err().to_string();
        assert!(e.contains("no `<!-- results from DIR -->` line"), "{e}");

        let text = "<!-- results from . -->\n# Title\nbefore\n<!-- report provenance -->\nstale\n<!-- end report -->\nafter\n";
        let once = fill(text, &page, None).unwrap();
        assert!(once.contains("# Title\nbefore\n") && once.contains("\nafter\n"));
        assert!(!once.contains("stale"));
        assert!(once.contains("| file | workloads |"));
        // Filling is idempotent: a filled page is what filling it again gives.
        assert_eq!(fill(&once, &page, None).unwrap(), once);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_folder_given_is_written_relative_to_the_page() {
        assert_eq!(
            relative_to(Path::new("baseline-data/x"), Path::new("docs")),
            "../baseline-data/x"
        );
        assert_eq!(
            relative_to(Path::new("/abs/x"), Path::new("docs")),
            "/abs/x"
        );
    }
}
