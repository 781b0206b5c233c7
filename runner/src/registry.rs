//! Every transport the runner knows, by the spec given on the command line.

use transport_core::Transport;

/// Every spec with its one-line description, in the order `runner list` shows them.
pub fn variants() -> Vec<(&'static str, &'static str)> {
    let mut v = Vec::new();
    v.extend_from_slice(transport_pure::VARIANTS);
    v.extend_from_slice(transport_quinn::VARIANTS);
    v.extend_from_slice(transport_s2n_quic::VARIANTS);
    v.extend_from_slice(transport_mqtt::VARIANTS);
    v
}

/// The transport for a spec such as `pure:plain`.
pub fn transport(spec: &str) -> Result<Box<dyn Transport>, String> {
    let found = transport_pure::transport(spec)
        .or_else(|| {
            (spec == "quinn")
                .then(|| transport_quinn::transport(None))
                .flatten()
        })
        .or_else(|| transport_s2n_quic::transport(spec))
        .or_else(|| transport_mqtt::transport_for_spec(spec));
    found.ok_or_else(|| {
        let names: Vec<_> = variants().iter().map(|(n, _)| *n).collect();
        format!(
            "unknown transport `{spec}` (choose from: {})",
            names.join(", ")
        )
    })
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
