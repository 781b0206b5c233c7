//! Every scenario runs and checks its own result (natively, without callgrind): a scenario that broke fails here
//! rather than counting a shortcut.

use icount::meter::Meter;
use icount::scenarios::ALL;

#[test]
fn every_scenario_runs_and_its_checks_pass() {
    for s in ALL {
        let meter = Meter::new(s.name, 2).unwrap();
        (s.run)(&meter).unwrap_or_else(|e| panic!("{}: {e:#}", s.name));
    }
}

#[test]
fn names_are_unique_and_shaped_as_area_slash_operation() {
    let mut names: Vec<_> = ALL.iter().map(|s| s.name).collect();
    assert!(names.iter().all(|n| n.contains('/') && !n.contains(' ')));
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), ALL.len());
}
