use std::sync::Arc;
use transport_core::tls::DeviceCredentials;
use transport_core::Counters;

fn rss() -> String {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("VmRSS"))
        .collect()
}

#[test]
fn scratch_config_memory() {
    let n: u32 = std::env::var("DEVS")
        .map(|v| v.parse().unwrap())
        .unwrap_or(2000);
    let dir = tempfile::tempdir().unwrap();
    let t = std::time::Instant::now();
    transport_core::tls::write_pki(dir.path(), n).unwrap();
    eprintln!("pki {:?}", t.elapsed());
    let creds = Arc::new(DeviceCredentials::load(dir.path()).unwrap());
    eprintln!("before {}", rss());
    let (_tls, table) =
        transport_s2n_quic::tls::s2n_tls_devices(dir.path(), creds.clone(), n).unwrap();
    let t = std::time::Instant::now();
    for d in 0..n {
        table.prepare(d).unwrap();
    }
    eprintln!("s2n-tls {n} configs in {:?}: {}", t.elapsed(), rss());
    let (_tls2, table2) = transport_s2n_quic::tls::rustls_devices(
        dir.path(),
        creds,
        n,
        Arc::new(Counters::default()),
    )
    .unwrap();
    let t = std::time::Instant::now();
    for d in 0..n {
        table2.prepare(d).unwrap();
    }
    eprintln!("rustls {n} configs in {:?}: {}", t.elapsed(), rss());
}
