//! Progress of `runner run`: which run of how many, the time elapsed and an estimate of the time left, so that a
//! 25-minute seed run is never silent.
//!
//! On a terminal, one line redrawn in place by `indicatif` (the elapsed time and the time left tick every second),
//! with the runs' own lines printed above it; otherwise (a pipe, a CI log) one plain line as each run starts.
//!
//! The time left is the sum, over the runs still to come, of how long runs like each took so far: the mean of the
//! same workload and transport, else of the same workload, else of every run. Before the first run ends it is
//! unknown, and it says so.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};
use std::io::IsTerminal;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The estimate of the time left: the runs to come and how long the finished ones took.
#[derive(Debug, Default)]
pub struct Estimate {
    /// (workload, transport) of every run not finished, in order.
    to_come: Vec<(String, String)>,
    /// (workload, transport, duration) of every finished run.
    done: Vec<(String, String, Duration)>,
}

impl Estimate {
    /// An estimate for these runs, in the order they will run.
    pub fn new(runs: Vec<(String, String)>) -> Estimate {
        Estimate {
            to_come: runs,
            done: Vec::new(),
        }
    }

    /// The next run finished after `took`.
    pub fn finished(&mut self, took: Duration) {
        if !self.to_come.is_empty() {
            let (w, t) = self.to_come.remove(0);
            self.done.push((w, t, took));
        }
    }

    fn mean(&self, keep: impl Fn(&str, &str) -> bool) -> Option<Duration> {
        let taken: Vec<Duration> = self
            .done
            .iter()
            .filter(|(w, t, _)| keep(w, t))
            .map(|(_, _, d)| *d)
            .collect();
        let n = u32::try_from(taken.len()).ok().filter(|n| *n > 0)?;
        Some(taken.iter().sum::<Duration>() / n)
    }

    /// The time the runs to come will take, the one under way included; `None` before any run finished.
    pub fn left(&self) -> Option<Duration> {
        let all = self.mean(|_, _| true)?;
        Some(
            self.to_come
                .iter()
                .map(|(w, t)| {
                    self.mean(|dw, dt| dw == w && dt == t)
                        .or_else(|| self.mean(|dw, _| dw == w))
                        .unwrap_or(all)
                })
                .sum(),
        )
    }
}

/// `1h 02m`, `4m 05s`, `12s`.
pub fn short(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 3600 {
        format!("{}h {:02}m", s / 3600, s % 3600 / 60)
    } else if s >= 60 {
        format!("{}m {:02}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

struct Shared {
    estimate: Estimate,
    /// When the run under way started.
    run_started: Instant,
}

/// The progress of one invocation.
pub struct Progress {
    shared: Arc<Mutex<Shared>>,
    started: Instant,
    total: usize,
    position: usize,
    /// Present on a terminal.
    bar: Option<ProgressBar>,
}

impl Progress {
    /// Progress over these runs (workload, transport), in the order they will run; a bar when stderr is a terminal.
    pub fn new(runs: Vec<(String, String)>) -> Progress {
        let total = runs.len();
        let shared = Arc::new(Mutex::new(Shared {
            estimate: Estimate::new(runs),
            run_started: Instant::now(),
        }));
        let bar = std::io::stderr().is_terminal().then(|| {
            let left = {
                let shared = shared.clone();
                move |_: &ProgressState, w: &mut dyn std::fmt::Write| {
                    let _ = w.write_str(&time_left(&shared));
                }
            };
            let style = ProgressStyle::with_template(
                "{prefix} [{bar:24}] {pos}/{len} · elapsed {elapsed} · {left}",
            )
            .expect("a valid template")
            .with_key("left", left)
            .progress_chars("=> ");
            let bar =
                ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::stderr());
            bar.set_style(style);
            bar.enable_steady_tick(Duration::from_secs(1));
            bar
        });
        Progress {
            shared,
            started: Instant::now(),
            total,
            position: 0,
            bar,
        }
    }

    /// A run starts: `what` names it (`drain · pure:plain · round 2/3`).
    pub fn start(&mut self, what: &str) {
        self.position += 1;
        self.shared.lock().expect("progress lock").run_started = Instant::now();
        match &self.bar {
            Some(bar) => {
                bar.set_position(self.position as u64 - 1);
                bar.set_prefix(what.to_string());
            }
            None => eprintln!(
                "[{}/{}] {what} · elapsed {} · {}",
                self.position,
                self.total,
                short(self.started.elapsed()),
                time_left(&self.shared)
            ),
        }
    }

    /// The run under way ended (finished, failed or skipped).
    pub fn end(&mut self) {
        let mut s = self.shared.lock().expect("progress lock");
        let took = s.run_started.elapsed();
        s.estimate.finished(took);
        if let Some(bar) = &self.bar {
            bar.set_position(self.position as u64);
        }
    }

    /// A line above the bar (or on stderr).
    pub fn println(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.println(line),
            None => eprintln!("{line}"),
        }
    }

    /// A printer for lines from elsewhere (the harness), safe to call from any thread.
    pub fn printer(&self) -> Arc<dyn Fn(&str) + Send + Sync> {
        let bar = self.bar.clone();
        Arc::new(move |line: &str| match &bar {
            Some(bar) => bar.println(line),
            None => eprintln!("{line}"),
        })
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// The time left as shown: the estimate less what the run under way has already taken.
fn time_left(shared: &Mutex<Shared>) -> String {
    let s = shared.lock().expect("progress lock");
    match s.estimate.left() {
        Some(left) => format!(
            "about {} left",
            short(left.saturating_sub(s.run_started.elapsed()))
        ),
        None => "time left: known after the first run".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(w, t)| (w.to_string(), t.to_string()))
            .collect()
    }

    #[test]
    fn the_estimate_learns_from_like_runs() {
        let mut e = Estimate::new(runs(&[
            ("drain", "plain"),
            ("drain", "sealed"),
            ("drain", "plain"),
            ("drain", "sealed"),
            ("restart", "pure"),
        ]));
        assert_eq!(e.left(), None, "unknown before a run ends");
        e.finished(Duration::from_secs(10));
        // Nothing known of sealed or restart yet: every run is taken as long as the one seen.
        assert_eq!(e.left(), Some(Duration::from_secs(40)));
        e.finished(Duration::from_secs(30));
        // plain 10 s, sealed 30 s, restart: the mean of the drain runs (20 s).
        assert_eq!(e.left(), Some(Duration::from_secs(10 + 30 + 20)));
        e.finished(Duration::from_secs(10));
        e.finished(Duration::from_secs(30));
        e.finished(Duration::from_secs(100));
        assert_eq!(e.left(), Some(Duration::ZERO));
        e.finished(Duration::from_secs(1));
        assert_eq!(e.done.len(), 5, "a finish beyond the plan is ignored");
    }

    #[test]
    fn durations_read_short() {
        assert_eq!(short(Duration::from_secs(12)), "12s");
        assert_eq!(short(Duration::from_secs(245)), "4m 05s");
        assert_eq!(short(Duration::from_secs(3720)), "1h 02m");
    }
}
