//! What every bench file shares: a criterion configuration short enough for two shared cores.

use criterion::Criterion;
use std::time::Duration;

/// 1 s warm-up, 3 s of 30 samples per benchmark; the command line can still override each
/// (`-- --measurement-time 10`).
pub fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30)
}
