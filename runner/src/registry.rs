//! Every transport the runner knows: each transport crate's list of specs, in the order `runner list` shows them.

use transport_core::{Spec, Transport};

/// Every transport crate's specs. Adding a transport crate is one line here.
const CRATES: &[&[Spec]] = &[
    transport_pure::SPECS,
    transport_quinn::SPECS,
    transport_s2n_quic::SPECS,
    transport_mqtt::SPECS,
];

/// Every spec, in the order `runner list` shows them.
pub fn specs() -> impl Iterator<Item = &'static Spec> {
    CRATES.iter().flat_map(|c| c.iter())
}

/// The transport for a spec such as `pure:plain`.
pub fn transport(spec: &str) -> Result<Box<dyn Transport>, String> {
    match specs().find(|s| s.name == spec) {
        Some(s) => Ok((s.make)()),
        None => {
            let names: Vec<_> = specs().map(|s| s.name).collect();
            Err(format!(
                "unknown transport `{spec}` (choose from: {})",
                names.join(", ")
            ))
        }
    }
}

/// Parse a comma-separated list of specs; the first unknown one is the error.
pub fn parse_list(list: &str) -> Result<Vec<Box<dyn Transport>>, String> {
    let specs: Vec<&str> = list
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if specs.is_empty() {
        return Err("no transport given".into());
    }
    specs.into_iter().map(transport).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spec_makes_its_transport_and_names_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for s in specs() {
            assert_eq!((s.make)().spec(), s.name);
            assert!(seen.insert(s.name), "{} twice", s.name);
        }
        let e = parse_list("pure,nope").err().unwrap();
        assert!(e.contains("nope") && e.contains("quinn"), "{e}");
    }
}
