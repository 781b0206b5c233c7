//! The measured section: the only code callgrind counts.
//!
//! The driver starts callgrind with collection off (`--collect-atstart=no`) and toggles it on entry to and exit from
//! [`icount_measured_section`] (`--toggle-collect`). A scenario runs its setup and everything it does not want
//! counted (the other side of a link, building the input, checking the output) outside that function, and passes
//! the operation it measures through [`Section::measure`]. The symbol is unmangled so the driver can name it exactly.
//!
//! Every scenario first runs its step a few times uncounted ([`WARMUP`]): lazily built tables, CPU feature detection,
//! a thread's first draw from aws-lc's random generator and the allocator's first blocks are then paid for before
//! counting starts, and a steady state (an HPKE session set up, a receiver run learnt) is reached.

use anyhow::Context;
use std::hint::black_box;

/// Steps run uncounted before the counted ones.
pub const WARMUP: u64 = 3;

/// `ICOUNT_SLOWDOWN=PREFIX=LOOPS`: a deliberate slowdown for testing the regression check. Every measured section of
/// the scenarios whose name starts with `PREFIX` also spins `LOOPS` times (a few instructions each). Read only by
/// this tool, never by the code it measures.
pub const SLOWDOWN_ENV: &str = "ICOUNT_SLOWDOWN";

/// Everything inside this function is counted, nothing outside it. `extra_loops` is the deliberate slowdown (0
/// unless [`SLOWDOWN_ENV`] names the scenario).
#[no_mangle]
#[inline(never)]
pub fn icount_measured_section(op: &mut dyn FnMut(), extra_loops: u64) {
    op();
    for i in 0..extra_loops {
        black_box(i);
    }
}

/// The symbol the driver gives callgrind's `--toggle-collect`.
pub const SECTION_SYMBOL: &str = "icount_measured_section";

/// Runs a scenario's step: [`WARMUP`] times uncounted, then `iterations` times counted.
#[derive(Debug, Clone)]
pub struct Meter {
    iterations: u64,
    extra_loops: u64,
}

impl Meter {
    /// A meter for `iterations` counted steps of `scenario`, with the slowdown the environment asks for.
    pub fn new(scenario: &str, iterations: u64) -> anyhow::Result<Meter> {
        let extra_loops = match std::env::var(SLOWDOWN_ENV) {
            Ok(spec) => slowdown_for(&spec, scenario)?,
            Err(_) => 0,
        };
        Ok(Meter {
            iterations,
            extra_loops,
        })
    }

    /// Steps run in all, warm-up included.
    pub fn steps(&self) -> u64 {
        WARMUP + self.iterations
    }

    /// Run `step` for the warm-up and then the counted iterations; each call gets the iteration number and a
    /// [`Section`] that counts only when the iteration is a counted one.
    pub fn run(
        &self,
        mut step: impl FnMut(u64, &mut Section) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        for i in 0..self.steps() {
            let mut section = Section {
                counted: i >= WARMUP,
                extra_loops: self.extra_loops,
            };
            step(i, &mut section).with_context(|| format!("step {i}"))?;
        }
        Ok(())
    }
}

/// Parse `PREFIX=LOOPS` and return `LOOPS` if `scenario` starts with `PREFIX`, else 0.
fn slowdown_for(spec: &str, scenario: &str) -> anyhow::Result<u64> {
    let (prefix, loops) = spec
        .rsplit_once('=')
        .with_context(|| format!("{SLOWDOWN_ENV}={spec}: expected PREFIX=LOOPS"))?;
    let loops: u64 = loops
        .parse()
        .with_context(|| format!("{SLOWDOWN_ENV}={spec}: LOOPS is not a number"))?;
    Ok(if scenario.starts_with(prefix) {
        loops
    } else {
        0
    })
}

/// One step's access to the counted section.
#[derive(Debug)]
pub struct Section {
    counted: bool,
    extra_loops: u64,
}

impl Section {
    /// Run `op`, counted if this is a counted iteration.
    pub fn measure<R>(&mut self, op: impl FnOnce() -> R) -> R {
        self.measure_if(true, op)
    }

    /// Run `op`, counted only if `count` and this is a counted iteration (for scenarios that count one side of an
    /// exchange and run the other side uncounted).
    pub fn measure_if<R>(&mut self, count: bool, op: impl FnOnce() -> R) -> R {
        if !(count && self.counted) {
            return op();
        }
        let mut op = Some(op);
        let mut out = None;
        icount_measured_section(&mut || out = op.take().map(|f| f()), self.extra_loops);
        out.expect("the section runs its operation once")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slowdown_applies_to_the_named_scenarios_only() {
        assert_eq!(
            slowdown_for("mqtt/=100", "mqtt/encode-publish").unwrap(),
            100
        );
        assert_eq!(slowdown_for("mqtt/=100", "store/append").unwrap(), 0);
        assert_eq!(slowdown_for("=7", "anything").unwrap(), 7);
        assert!(slowdown_for("mqtt", "mqtt").is_err());
        assert!(slowdown_for("mqtt=x", "mqtt").is_err());
    }

    #[test]
    fn warmup_steps_are_not_counted_and_every_step_runs() {
        let meter = Meter {
            iterations: 4,
            extra_loops: 0,
        };
        let mut seen = Vec::new();
        meter
            .run(|i, s| {
                seen.push((i, s.counted));
                assert_eq!(s.measure(|| i * 2), i * 2);
                Ok(())
            })
            .unwrap();
        let counted: Vec<_> = seen.iter().filter(|(_, c)| *c).map(|(i, _)| *i).collect();
        assert_eq!(seen.len() as u64, WARMUP + 4);
        assert_eq!(counted, (WARMUP..WARMUP + 4).collect::<Vec<_>>());
    }
}
