//! Latency histograms: HdrHistogram in microseconds with 3 significant digits, kept whole in results.

use base64::Engine;
use hdrhistogram::serialization::{Deserializer, Serializer, V2Serializer};
use hdrhistogram::Histogram;
use std::time::Duration;

/// The highest latency a histogram records: one hour. Larger values are clamped, never dropped.
pub const MAX_US: u64 = 3_600_000_000;

/// A new latency histogram (µs, 3 significant digits).
pub fn new() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_US, 3).expect("valid bounds")
}

/// Record a duration, clamped to the histogram's range.
pub fn record(h: &mut Histogram<u64>, d: Duration) {
    record_n(h, d, 1);
}

/// Record a duration `n` times, clamped to the histogram's range.
pub fn record_n(h: &mut Histogram<u64>, d: Duration, n: u64) {
    let us = (d.as_micros() as u64).clamp(1, MAX_US);
    h.record_n(us, n).expect("clamped into range");
}

/// Serialize (V2, base64) for a result.
pub fn encode(h: &Histogram<u64>) -> String {
    let mut buf = Vec::new();
    V2Serializer::new()
        .serialize(h, &mut buf)
        .expect("serializing into memory cannot fail");
    base64::engine::general_purpose::STANDARD.encode(buf)
}

/// Read back what [`encode`] wrote.
pub fn decode(text: &str) -> Result<Histogram<u64>, String> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|e| format!("base64: {e}"))?;
    Deserializer::new()
        .deserialize(&mut &bytes[..])
        .map_err(|e| format!("histogram: {e:?}"))
}

/// A quantile in milliseconds (0 for an empty histogram).
pub fn quantile_ms(h: &Histogram<u64>, q: f64) -> f64 {
    if h.is_empty() {
        0.0
    } else {
        h.value_at_quantile(q) as f64 / 1000.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_keeps_the_distribution() {
        let mut h = new();
        for i in 1..=1000 {
            record(&mut h, Duration::from_micros(i * 10));
        }
        record(&mut h, Duration::from_secs(7200));
        let back = decode(&encode(&h)).unwrap();
        assert_eq!(back.len(), 1001);
        assert_eq!(back.value_at_quantile(0.5), h.value_at_quantile(0.5));
        assert!(back.max() >= MAX_US - MAX_US / 1000);
    }
}
