//! The `mqtt-broker` binary as a child process, for tests where the broker may crash (a crash must fail the test,
//! not take the test process with it) or must be killed with SIGKILL and started again on the same ports and
//! directories. The child is killed when the handle is dropped, and by the kernel if the test process dies first.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// A running `mqtt-broker`.
pub struct BrokerProcess {
    child: Child,
    /// The TLS listener.
    pub tls: SocketAddr,
    /// The plaintext listener.
    pub plain: SocketAddr,
    /// Its directory: `id/` (the PKI) and `store/`.
    pub dir: PathBuf,
}

impl BrokerProcess {
    /// Start the broker in `dir` (writing a PKI for `devices` devices first if there is none) with both listeners on
    /// the given addresses (port 0 for any) and `extra` arguments.
    pub fn start(
        dir: &Path,
        devices: u32,
        tls: SocketAddr,
        plain: SocketAddr,
        extra: &[&str],
    ) -> BrokerProcess {
        let identity = dir.join("id");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_mqtt-broker"));
        cmd.arg("--identity").arg(&identity);
        if !identity.join(transport_tls::CA_FILE).exists() {
            cmd.args(["--prepare", &devices.to_string()]);
        }
        cmd.arg("--store")
            .arg(dir.join("store"))
            .args(["--sync", "none", "--listen", &tls.to_string()])
            .args(["--plaintext", &plain.to_string()])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().expect("start mqtt-broker");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        // Read the log for the two addresses, then keep draining it so the broker never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let (mut tls, mut plain) = (None, None);
        let mut log = Vec::new();
        while tls.is_none() || plain.is_none() {
            let line = match rx.recv_timeout(Duration::from_secs(20)) {
                Ok(line) => line,
                Err(_) => panic!("mqtt-broker did not start: {log:?}"),
            };
            let addr = || line.rsplit(' ').next().unwrap().parse::<SocketAddr>().ok();
            if line.contains("TLS 1.3 on") {
                tls = addr();
            } else if line.contains("plaintext on") {
                plain = addr();
            }
            log.push(line);
        }
        BrokerProcess {
            child,
            tls: tls.unwrap(),
            plain: plain.unwrap(),
            dir: dir.to_path_buf(),
        }
    }

    /// Whether the process is still running.
    pub fn is_alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGKILL it and reap it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for BrokerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Any free port on 127.0.0.1.
pub fn any_port() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}
