//! Where the numbers come from: the build (commit, dirty flag, profile, compiler and allocator, embedded by `build.rs` when the
//! runner was built, so they cannot drift from the code that measured), the machine (CPU, cores, kernel), the date,
//! the pinning, the priority and load average it ran at, and a random id shared by every result of one invocation.

use workloads::pin::Pinning;
use workloads::result::Provenance;

/// Read the machine and the build.
pub fn collect(profile: &str, pinning: Pinning) -> Provenance {
    Provenance {
        commit: env!("RUNNER_GIT_COMMIT").to_string(),
        dirty: env!("RUNNER_GIT_DIRTY") == "true",
        build_profile: env!("RUNNER_BUILD_PROFILE").to_string(),
        rustc: env!("RUNNER_RUSTC_VERSION").to_string(),
        allocator: crate::ALLOCATOR.to_string(),
        cpu: cpu_model(),
        cores: std::thread::available_parallelism()
            .map(|n| n.get() as u32)
            .unwrap_or(0),
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default(),
        date: rfc3339_utc(std::time::SystemTime::now()),
        profile: profile.to_string(),
        invocation: format!("{:016x}", rand::random::<u64>()),
        pinning,
        priority: priority(),
        load_average: std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok()),
        warmup_rounds: 0,
    }
}

/// `nice N` of this process, and `autogroup nice M` where the kernel groups processes by session.
fn priority() -> String {
    // SAFETY: getpriority only reads. It can return -1 legitimately; errno tells, but -1 is a fine answer to print.
    let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
    let group = std::fs::read_to_string("/proc/self/autogroup")
        .ok()
        .and_then(|s| s.split("nice").nth(1).map(|n| n.trim().to_string()));
    match group {
        Some(g) => format!("nice {nice}, autogroup nice {g}"),
        None => format!("nice {nice}"),
    }
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// Format a time as `YYYY-MM-DDTHH:MM:SSZ` (UTC), without a date library.
pub fn rfc3339_utc(t: std::time::SystemTime) -> String {
    let secs = t
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn the_build_is_embedded() {
        let p = collect("quick", Pinning::default());
        // In a checkout the commit is a full hash; outside one, `unknown`.
        assert!(
            p.commit == "unknown"
                || (p.commit.len() == 40 && p.commit.chars().all(|c| c.is_ascii_hexdigit())),
            "{}",
            p.commit
        );
        assert!(
            ["debug", "release"].contains(&p.build_profile.as_str()),
            "{}",
            p.build_profile
        );
        assert_eq!(p.invocation.len(), 16);
        assert_ne!(
            p.invocation,
            collect("quick", Pinning::default()).invocation
        );
    }

    #[test]
    fn dates() {
        assert_eq!(rfc3339_utc(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(
            rfc3339_utc(UNIX_EPOCH + Duration::from_secs(1_796_216_400)),
            "2026-12-02T13:00:00Z"
        );
        assert_eq!(
            rfc3339_utc(UNIX_EPOCH + Duration::from_secs(951_782_400)),
            "2000-02-29T00:00:00Z"
        );
    }
}
