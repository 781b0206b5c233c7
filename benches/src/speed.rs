//! `openssl speed` as an outside cross-check of the criterion numbers for OpenSSL.
//!
//! What it measures differs from the benches: ECDSA signs a 20-byte digest (no hashing, no DER wrapping beyond
//! the signature itself) and verifies with a key parsed once; ECDH derives with a context whose peer key was set
//! once, so no point parsing or validation is counted. By default it counts user CPU time, not wall time;
//! [`COMMAND`] asks for wall time (`-elapsed`), as criterion measures.

use std::process::Command;

/// The command run by [`run`]; `ecdhx25519` is the name OpenSSL 1.1.1 to 3.x accept for X25519.
pub const COMMAND: &[&str] = &[
    "speed",
    "-elapsed",
    "-seconds",
    "1",
    "ecdhp256",
    "ecdsap256",
    "ecdhx25519",
];

/// Microseconds per operation, as `openssl speed` reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Speed {
    pub ecdh_p256: Option<f64>,
    pub ecdsa_p256_sign: Option<f64>,
    pub ecdsa_p256_verify: Option<f64>,
    pub x25519: Option<f64>,
}

impl Speed {
    /// The value for a benchmark group of the seed table, if `openssl speed` measures that operation.
    pub fn for_group(&self, group: &str) -> Option<f64> {
        match group {
            "p256/ecdh" => self.ecdh_p256,
            "p256/ecdsa-sign" => self.ecdsa_p256_sign,
            "p256/ecdsa-verify-parsed" => self.ecdsa_p256_verify,
            "x25519/agree" => self.x25519,
            _ => None,
        }
    }

    pub fn is_empty(&self) -> bool {
        *self == Speed::default()
    }
}

/// Parses the human-readable summary of `openssl speed`, e.g.
/// ` 256 bits ecdsa (nistp256)   0.0000s   0.0001s  54432.6  17853.3` (sign/s, verify/s last) and
/// ` 256 bits ecdh (nistp256)   0.0000s  22642.4` (op/s last). Lines it does not know are ignored.
pub fn parse(output: &str) -> Speed {
    let mut speed = Speed::default();
    for line in output.lines() {
        let tokens: Vec<&str> = line.split_whitespace().collect();
        let Some(kind) = tokens.iter().position(|t| *t == "ecdsa" || *t == "ecdh") else {
            continue;
        };
        let Some(curve) = tokens
            .get(kind + 1)
            .and_then(|t| t.strip_prefix('(')?.strip_suffix(')'))
        else {
            continue;
        };
        // the rates are the trailing plain numbers; the times before them end in "s"
        let rates: Vec<f64> = tokens[kind + 2..]
            .iter()
            .filter_map(|t| t.parse::<f64>().ok())
            .collect();
        let per_op = |rate: f64| (rate > 0.0).then(|| 1e6 / rate);
        match (
            tokens[kind],
            curve.to_ascii_lowercase().as_str(),
            rates.as_slice(),
        ) {
            ("ecdsa", "nistp256", [.., sign, verify]) => {
                speed.ecdsa_p256_sign = per_op(*sign);
                speed.ecdsa_p256_verify = per_op(*verify);
            }
            ("ecdh", "nistp256", [.., op]) => speed.ecdh_p256 = per_op(*op),
            ("ecdh", "x25519", [.., op]) => speed.x25519 = per_op(*op),
            _ => {}
        }
    }
    speed
}

/// Runs [`COMMAND`] (about four seconds); the reason when the binary is missing or fails.
pub fn run() -> Result<Speed, String> {
    let output = Command::new("openssl")
        .args(COMMAND)
        .output()
        .map_err(|e| format!("cannot run `openssl {}`: {e}", COMMAND.join(" ")))?;
    if !output.status.success() {
        return Err(format!(
            "`openssl {}` failed: {}",
            COMMAND.join(" "),
            output.status
        ));
    }
    let speed = parse(&String::from_utf8_lossy(&output.stdout));
    if speed.is_empty() {
        return Err(format!(
            "`openssl {}` printed no result this tool knows",
            COMMAND.join(" ")
        ));
    }
    Ok(speed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The summary `openssl speed -seconds 1 ecdhp256 ecdsap256 ecdhx25519` printed with OpenSSL 3.0.19.
    const OUTPUT: &str = "\
version: 3.0.19
built on: Fri Apr  3 12:29:32 2026 UTC
options: bn(64,64)
CPUINFO: OPENSSL_ia32cap=0xfffa32034f8bffff:0x1a415f46f1bf2ffb
                              sign    verify    sign/s verify/s
 256 bits ecdsa (nistp256)   0.0000s   0.0001s  54432.6  17853.3
                              op      op/s
 256 bits ecdh (nistp256)   0.0000s  22642.4
 253 bits ecdh (X25519)   0.0000s  37840.6
";

    #[test]
    fn parses_rates_into_microseconds_per_operation() {
        let s = parse(OUTPUT);
        let close = |a: Option<f64>, b: f64| (a.unwrap() - b).abs() < 0.01;
        assert!(close(s.ecdsa_p256_sign, 1e6 / 54432.6));
        assert!(close(s.ecdsa_p256_verify, 1e6 / 17853.3));
        assert!(close(s.ecdh_p256, 1e6 / 22642.4));
        assert!(close(s.x25519, 1e6 / 37840.6));
        assert_eq!(s.for_group("p256/keygen"), None);
        assert_eq!(s.for_group("x25519/agree"), s.x25519);
    }

    #[test]
    fn unrelated_output_gives_nothing() {
        assert!(parse("speed: Unknown algorithm x25519\n").is_empty());
    }
}
