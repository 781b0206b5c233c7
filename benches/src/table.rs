//! Markdown tables from saved criterion results: the seed-style table (µs per operation per implementation and
//! the ratio RustCrypto / assembly), one table per other area (HPKE, AEADs), and a comparison of two baselines.

use crate::estimates::{BenchId, Measurement, Statistic};
use crate::speed::Speed;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

/// Every group the benches write, in display order, with the row label.
const GROUPS: &[(&str, &str)] = &[
    ("p256/keygen", "P-256 key generation"),
    ("p256/ecdh", "ECDH P-256"),
    ("p256/ecdsa-sign", "ECDSA P-256 sign"),
    ("p256/ecdsa-verify", "ECDSA P-256 verify (unknown key)"),
    (
        "p256/ecdsa-verify-parsed",
        "ECDSA P-256 verify (key parsed once)",
    ),
    ("x25519/keygen", "X25519 key generation"),
    ("x25519/agree", "X25519 agreement"),
    ("handshake/estimate", "handshake estimate (measured as one)"),
    ("hpke/setup-sender", "sender setup"),
    ("hpke/setup-receiver", "receiver setup"),
    ("hpke/seal", "seal"),
    ("hpke/open", "open"),
    ("aead/aes128gcm-seal", "AES-128-GCM seal"),
    ("aead/aes128gcm-open", "AES-128-GCM open"),
    ("aead/chacha20poly1305-seal", "ChaCha20-Poly1305 seal"),
    ("aead/chacha20poly1305-open", "ChaCha20-Poly1305 open"),
    ("openssl-paths/ecdh", "ECDH P-256"),
    ("openssl-paths/ecdsa-sign", "ECDSA P-256 sign"),
    (
        "openssl-paths/ecdsa-verify",
        "ECDSA P-256 verify (parsed key)",
    ),
    ("openssl-paths/x25519", "X25519 agreement"),
];

/// The groups of the seed table; the rest go into one table per area.
const SEED_AREAS: &[&str] = &["p256", "x25519", "handshake"];

/// Implementations in column order; unknown ones follow alphabetically.
const COLUMN_ORDER: &[&str] = &["openssl", "aws-lc-rs", "ring", "rustcrypto", "x25519-dalek"];

/// The portable implementations, one column in the seed table.
const PORTABLE: &[&str] = &["rustcrypto", "x25519-dalek"];

/// The assembly implementations the portable one is compared with.
const ASSEMBLY: &[(&str, &str)] = &[
    ("openssl", "OpenSSL"),
    ("aws-lc-rs", "aws-lc-rs"),
    ("ring", "ring"),
];

fn display_name(function: &str) -> &str {
    match function {
        "openssl" => "OpenSSL",
        "rustcrypto" => "RustCrypto",
        other => other,
    }
}

fn group_rank(group: &str) -> (usize, &str) {
    (
        GROUPS
            .iter()
            .position(|(g, _)| *g == group)
            .unwrap_or(GROUPS.len()),
        group,
    )
}

fn group_label(group: &str) -> &str {
    GROUPS
        .iter()
        .find(|(g, _)| *g == group)
        .map_or(group, |(_, label)| label)
}

fn area(group: &str) -> &str {
    group.split('/').next().unwrap_or(group)
}

fn column_rank(function: &str) -> (usize, &str) {
    (
        COLUMN_ORDER
            .iter()
            .position(|c| *c == function)
            .unwrap_or(COLUMN_ORDER.len()),
        function,
    )
}

/// A table row: one group, and one parameter value within it (a message size).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct RowKey<'a> {
    group: (usize, &'a str),
    /// Numeric values sort as numbers (64 before 1024).
    value: (Option<u64>, Option<&'a str>),
}

impl<'a> RowKey<'a> {
    fn of(id: &'a BenchId) -> Self {
        let value = id.value.as_deref();
        RowKey {
            group: group_rank(&id.group),
            value: (value.and_then(|v| v.parse().ok()), value),
        }
    }
}

/// Microseconds with three significant digits.
pub fn format_us(us: f64) -> String {
    if us >= 100.0 {
        format!("{us:.0}")
    } else if us >= 10.0 {
        format!("{us:.1}")
    } else if us >= 1.0 {
        format!("{us:.2}")
    } else {
        format!("{us:.3}")
    }
}

fn format_ratio(ratio: f64) -> String {
    if ratio >= 1.0 {
        format!("{ratio:.1}x")
    } else {
        format!("{ratio:.2}x")
    }
}

fn micros(m: &Measurement, statistic: Statistic) -> f64 {
    m.estimates.get(statistic).point_estimate / 1000.0
}

/// A Markdown table; the columns in `numeric` are right-aligned.
fn markdown(header: &[String], numeric: std::ops::Range<usize>, rows: &[Vec<String>]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "| {} |", header.join(" | "));
    let align: Vec<&str> = (0..header.len())
        .map(|i| if numeric.contains(&i) { "---:" } else { "---" })
        .collect();
    let _ = writeln!(out, "|{}|", align.join("|"));
    for row in rows {
        let _ = writeln!(out, "| {} |", row.join(" | "));
    }
    out
}

/// The seed-style table: P-256, X25519 and the handshake estimate, µs per operation per implementation, the
/// ratio RustCrypto / each assembly implementation, and the sum of the parts of the handshake estimate (a check
/// on the measured one). `None` when no such group was measured.
pub fn seed_table(
    results: &[Measurement],
    statistic: Statistic,
    speed: Option<&Speed>,
) -> Option<String> {
    let mut cells: BTreeMap<&str, BTreeMap<&str, f64>> = BTreeMap::new();
    for m in results
        .iter()
        .filter(|m| SEED_AREAS.contains(&area(&m.id.group)) && m.id.value.is_none())
    {
        let Some(function) = m.id.function.as_deref() else {
            continue;
        };
        let column = if PORTABLE.contains(&function) {
            "rustcrypto"
        } else {
            function
        };
        cells
            .entry(m.id.group.as_str())
            .or_default()
            .insert(column, micros(m, statistic));
    }
    if cells.is_empty() {
        return None;
    }
    let mut columns: Vec<&str> = cells
        .values()
        .flat_map(|c| c.keys().copied())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    columns.sort_by_key(|c| column_rank(c));
    let ratios: Vec<(&str, &str)> = if columns.contains(&"rustcrypto") {
        ASSEMBLY
            .iter()
            .copied()
            .filter(|(id, _)| columns.contains(id))
            .collect()
    } else {
        Vec::new()
    };

    let mut groups: Vec<&str> = cells.keys().copied().collect();
    groups.sort_by_key(|g| group_rank(g));
    let mut rows: Vec<(String, BTreeMap<&str, f64>, Option<f64>)> = groups
        .iter()
        .map(|g| {
            (
                group_label(g).to_string(),
                cells[g].clone(),
                speed.and_then(|s| s.for_group(g)),
            )
        })
        .collect();
    if let Some(sum) = handshake_sum(&cells, &columns) {
        rows.push((
            "handshake estimate (sum of the rows)".to_string(),
            sum,
            None,
        ));
    }

    let mut header = vec!["operation".to_string()];
    header.extend(columns.iter().map(|c| format!("{} (µs)", display_name(c))));
    header.extend(
        ratios
            .iter()
            .map(|(_, name)| format!("RustCrypto / {name}")),
    );
    if speed.is_some() {
        header.push("openssl speed (µs)".to_string());
    }
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|(label, values, outside)| {
            let mut row = vec![label.clone()];
            row.extend(
                columns
                    .iter()
                    .map(|c| values.get(c).map_or("-".to_string(), |v| format_us(*v))),
            );
            row.extend(ratios.iter().map(|(id, _)| {
                match (values.get("rustcrypto"), values.get(id)) {
                    (Some(portable), Some(asm)) if *asm > 0.0 => format_ratio(portable / asm),
                    _ => "-".to_string(),
                }
            }));
            if speed.is_some() {
                row.push(outside.map_or("-".to_string(), format_us));
            }
            row
        })
        .collect();
    Some(markdown(&header, 1..header.len(), &body))
}

/// What `handshake.rs` measures, added up from the separate rows: a verification with a parsed key (or an
/// unknown one where the library cannot keep parsed keys), one with an unknown key, a signature, and X25519 key
/// generation and agreement. Only for columns that have every part.
fn handshake_sum<'a>(
    cells: &BTreeMap<&str, BTreeMap<&'a str, f64>>,
    columns: &[&'a str],
) -> Option<BTreeMap<&'a str, f64>> {
    let get = |group: &str, column: &str| cells.get(group).and_then(|c| c.get(column)).copied();
    let sum: BTreeMap<&str, f64> = columns
        .iter()
        .filter_map(|&c| {
            let verify = get("p256/ecdsa-verify", c)?;
            let issuer = get("p256/ecdsa-verify-parsed", c).unwrap_or(verify);
            let parts = [
                issuer,
                verify,
                get("p256/ecdsa-sign", c)?,
                get("x25519/keygen", c)?,
                get("x25519/agree", c)?,
            ];
            Some((c, parts.iter().sum()))
        })
        .collect();
    (!sum.is_empty()).then_some(sum)
}

/// One table per area outside the seed table (`hpke`, `aead`, and any added later): a row per group and
/// message size, a column per function, and RustCrypto / the others where RustCrypto is a column.
pub fn area_tables(results: &[Measurement], statistic: Statistic) -> Vec<(String, String)> {
    let mut areas: BTreeMap<&str, Vec<&Measurement>> = BTreeMap::new();
    for m in results
        .iter()
        .filter(|m| !SEED_AREAS.contains(&area(&m.id.group)) || m.id.value.is_some())
    {
        areas.entry(area(&m.id.group)).or_default().push(m);
    }
    let mut tables = Vec::new();
    for (name, measurements) in areas {
        let mut columns: Vec<&str> = measurements
            .iter()
            .map(|m| m.id.function.as_deref().unwrap_or("-"))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        columns.sort_by_key(|c| column_rank(c));
        let others: Vec<&str> = if columns.contains(&"rustcrypto") {
            columns
                .iter()
                .copied()
                .filter(|c| *c != "rustcrypto")
                .collect()
        } else {
            Vec::new()
        };

        let mut rows: BTreeMap<RowKey, (String, BTreeMap<&str, f64>)> = BTreeMap::new();
        for m in &measurements {
            let label = match (&m.id.value, m.bytes) {
                (Some(_), Some(bytes)) => format!("{}, {bytes} B", group_label(&m.id.group)),
                (Some(value), None) => format!("{}, {value}", group_label(&m.id.group)),
                (None, _) => group_label(&m.id.group).to_string(),
            };
            let row = rows
                .entry(RowKey::of(&m.id))
                .or_insert_with(|| (label, BTreeMap::new()));
            row.1.insert(
                m.id.function.as_deref().unwrap_or("-"),
                micros(m, statistic),
            );
        }

        let mut header = vec!["operation".to_string()];
        header.extend(columns.iter().map(|c| format!("{} (µs)", display_name(c))));
        header.extend(
            others
                .iter()
                .map(|c| format!("RustCrypto / {}", display_name(c))),
        );
        let body: Vec<Vec<String>> = rows
            .into_values()
            .map(|(label, values)| {
                let mut row = vec![label];
                row.extend(
                    columns
                        .iter()
                        .map(|c| values.get(c).map_or("-".to_string(), |v| format_us(*v))),
                );
                row.extend(others.iter().map(|c| {
                    match (values.get("rustcrypto"), values.get(c)) {
                        (Some(portable), Some(other)) if *other > 0.0 => {
                            format_ratio(portable / other)
                        }
                        _ => "-".to_string(),
                    }
                }));
                row
            })
            .collect();
        tables.push((name.to_string(), markdown(&header, 1..header.len(), &body)));
    }
    tables
}

/// What the comparison of one benchmark says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The confidence intervals overlap.
    NoChange,
    /// Slower, and the intervals are apart.
    Regressed,
    /// Faster, and the intervals are apart.
    Improved,
}

impl Verdict {
    pub fn of(base: &Measurement, new: &Measurement, statistic: Statistic) -> Verdict {
        let (b, n) = (base.estimates.get(statistic), new.estimates.get(statistic));
        if b.confidence_interval.overlaps(&n.confidence_interval) {
            Verdict::NoChange
        } else if n.point_estimate > b.point_estimate {
            Verdict::Regressed
        } else {
            Verdict::Improved
        }
    }

    fn text(self) -> &'static str {
        match self {
            Verdict::NoChange => "no change",
            Verdict::Regressed => "regressed",
            Verdict::Improved => "improved",
        }
    }
}

fn with_interval(m: &Measurement, statistic: Statistic) -> String {
    let e = m.estimates.get(statistic);
    format!(
        "{} ({}–{})",
        format_us(e.point_estimate / 1000.0),
        format_us(e.confidence_interval.lower_bound / 1000.0),
        format_us(e.confidence_interval.upper_bound / 1000.0)
    )
}

/// critcmp-like: each benchmark in either baseline, its time in both with the confidence interval, the change,
/// and whether the intervals are apart.
pub fn compare_table(
    base: &[Measurement],
    new: &[Measurement],
    names: (&str, &str),
    statistic: Statistic,
) -> String {
    let base_by_id: BTreeMap<&BenchId, &Measurement> = base.iter().map(|m| (&m.id, m)).collect();
    let new_by_id: BTreeMap<&BenchId, &Measurement> = new.iter().map(|m| (&m.id, m)).collect();
    let mut ids: Vec<&BenchId> = base_by_id
        .keys()
        .chain(new_by_id.keys())
        .copied()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    ids.sort_by(|a, b| {
        RowKey::of(a).cmp(&RowKey::of(b)).then_with(|| {
            column_rank(a.function.as_deref().unwrap_or(""))
                .cmp(&column_rank(b.function.as_deref().unwrap_or("")))
        })
    });

    let header = vec![
        "benchmark".to_string(),
        format!("{} (µs, 95% CI)", names.0),
        format!("{} (µs, 95% CI)", names.1),
        "change".to_string(),
        "verdict".to_string(),
    ];
    let body: Vec<Vec<String>> = ids
        .into_iter()
        .map(|id| {
            let (b, n) = (base_by_id.get(id), new_by_id.get(id));
            let change = match (b, n) {
                (Some(b), Some(n)) => {
                    let (b, n) = (
                        b.estimates.get(statistic).point_estimate,
                        n.estimates.get(statistic).point_estimate,
                    );
                    format!("{:+.1}%", (n / b - 1.0) * 100.0)
                }
                _ => "-".to_string(),
            };
            let verdict = match (b, n) {
                (Some(b), Some(n)) => Verdict::of(b, n, statistic).text().to_string(),
                (Some(_), None) => format!("only in {}", names.0),
                (None, _) => format!("only in {}", names.1),
            };
            vec![
                format!("`{id}`"),
                b.map_or("-".to_string(), |m| with_interval(m, statistic)),
                n.map_or("-".to_string(), |m| with_interval(m, statistic)),
                change,
                verdict,
            ]
        })
        .collect();
    markdown(&header, 1..4, &body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimates::{ConfidenceInterval, Estimate, Estimates};

    fn measurement(
        group: &str,
        function: &str,
        value: Option<&str>,
        ns: f64,
        half_width: f64,
    ) -> Measurement {
        let estimate = Estimate {
            confidence_interval: ConfidenceInterval {
                confidence_level: 0.95,
                lower_bound: ns - half_width,
                upper_bound: ns + half_width,
            },
            point_estimate: ns,
            standard_error: half_width / 2.0,
        };
        Measurement {
            id: BenchId {
                group: group.into(),
                function: Some(function.into()),
                value: value.map(Into::into),
            },
            bytes: value.and_then(|v| v.parse().ok()),
            estimates: Estimates {
                mean: estimate,
                median: estimate,
            },
        }
    }

    #[test]
    fn the_seed_table_has_ratios_and_the_handshake_sum() {
        let mut results = Vec::new();
        for (group, openssl, portable) in [
            ("p256/ecdsa-verify", 43_000.0, 174_000.0),
            ("p256/ecdsa-verify-parsed", 40_000.0, 150_000.0),
            ("p256/ecdsa-sign", 15_000.0, 53_000.0),
            ("p256/ecdh", 33_000.0, 149_000.0),
        ] {
            results.push(measurement(group, "openssl", None, openssl, 100.0));
            results.push(measurement(group, "rustcrypto", None, portable, 100.0));
        }
        results.push(measurement(
            "x25519/keygen",
            "openssl",
            None,
            20_000.0,
            100.0,
        ));
        results.push(measurement(
            "x25519/keygen",
            "x25519-dalek",
            None,
            30_000.0,
            100.0,
        ));
        results.push(measurement(
            "x25519/agree",
            "openssl",
            None,
            30_000.0,
            100.0,
        ));
        results.push(measurement(
            "x25519/agree",
            "x25519-dalek",
            None,
            31_000.0,
            100.0,
        ));
        let speed = Speed {
            ecdh_p256: Some(30.0),
            ..Speed::default()
        };

        let table = seed_table(&results, Statistic::Median, Some(&speed)).unwrap();
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines[0],
            "| operation | OpenSSL (µs) | RustCrypto (µs) | RustCrypto / OpenSSL | openssl speed (µs) |"
        );
        assert_eq!(lines[2], "| ECDH P-256 | 33.0 | 149 | 4.5x | 30.0 |");
        assert_eq!(lines[3], "| ECDSA P-256 sign | 15.0 | 53.0 | 3.5x | - |");
        // 40 + 43 + 15 + 20 + 30 and 150 + 174 + 53 + 30 + 31
        assert_eq!(
            lines.last().unwrap(),
            &"| handshake estimate (sum of the rows) | 148 | 438 | 3.0x | - |"
        );
    }

    #[test]
    fn area_tables_sort_sizes_numerically() {
        let results = vec![
            measurement("aead/aes128gcm-seal", "ring", Some("1024"), 400.0, 1.0),
            measurement(
                "aead/aes128gcm-seal",
                "rustcrypto",
                Some("1024"),
                800.0,
                1.0,
            ),
            measurement("aead/aes128gcm-seal", "ring", Some("64"), 50.0, 1.0),
        ];
        let tables = area_tables(&results, Statistic::Median);
        assert_eq!(tables.len(), 1);
        let (area, table) = &tables[0];
        assert_eq!(area, "aead");
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines[0],
            "| operation | ring (µs) | RustCrypto (µs) | RustCrypto / ring |"
        );
        assert_eq!(lines[2], "| AES-128-GCM seal, 64 B | 0.050 | - | - |");
        assert_eq!(
            lines[3],
            "| AES-128-GCM seal, 1024 B | 0.400 | 0.800 | 2.0x |"
        );
    }

    #[test]
    fn comparison_says_whether_the_intervals_are_apart() {
        let base = vec![
            measurement("p256/ecdh", "openssl", None, 33_000.0, 200.0),
            measurement("p256/ecdh", "ring", None, 30_000.0, 200.0),
            measurement("p256/keygen", "ring", None, 10_000.0, 200.0),
        ];
        let new = vec![
            measurement("p256/ecdh", "openssl", None, 33_300.0, 200.0),
            measurement("p256/ecdh", "ring", None, 36_000.0, 200.0),
            measurement("p256/keygen", "ring", None, 8_000.0, 200.0),
            measurement("p256/keygen", "openssl", None, 8_000.0, 200.0),
        ];
        let table = compare_table(&base, &new, ("main", "branch"), Statistic::Median);
        let lines: Vec<&str> = table.lines().collect();
        assert!(
            lines[2].starts_with("| `p256/keygen/openssl` | - | 8.00"),
            "{}",
            lines[2]
        );
        assert!(lines[2].ends_with("| - | only in branch |"));
        assert!(lines[3].ends_with("| -20.0% | improved |"), "{}", lines[3]);
        assert!(lines[4].ends_with("| +0.9% | no change |"), "{}", lines[4]);
        assert!(lines[5].ends_with("| +20.0% | regressed |"), "{}", lines[5]);
    }
}
