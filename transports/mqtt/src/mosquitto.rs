//! A real mosquitto broker as a child process: the reference peer for interop tests and the `mqtt@mosquitto`
//! variant.
//!
//! [`Mosquitto::start`] writes a `mosquitto.conf` into a work directory — one listener on 127.0.0.1 only, TLS 1.3,
//! the suite's CA, server certificate and key (`transport_tls`), a client certificate required and its common
//! name used as the user name, no persistence, log to stderr, its queue bounds written out ([`config_text`]) — and a
//! second listener on a Unix socket in the work directory for the suite's own `$SYS` reader ([`follow_dropped`]);
//! starts `mosquitto -c mosquitto.conf`, and waits until the port accepts connections.
//!
//! Limits, so that it holds as many clients as the suite's workloads open (20,000 idle links): no limit of its own
//! on connections (`max_connections -1`) or memory; the open files it may hold are its process's limit, inherited
//! from the runner (one per client plus a few; a hard limit of 20,000 here, see docs/workloads.md, idle-links).
//! `$SYS` figures every second (`sys_interval 1`), so the heap figure follows a workload closely; connection
//! messages off, so 20,000 clients do not cost 20,000 log lines. The child never outlives its owner: dropping the handle kills it, and the
//! kernel kills it (`PR_SET_PDEATHSIG`) if the owning process dies first, even by SIGKILL. The child is started
//! from a thread of its own that lives exactly as long as the child, since the kernel ties that signal to the
//! thread that forked.
//!
//! [`Mosquitto::start_with`] adds [`Options`]: a plaintext listener for tests that speak raw MQTT, and extra
//! settings.
//!
//! [`device_pem`] writes one device's certificate and key as PEM files, for `mosquitto_pub --cert --key`.

use base64::Engine;
use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use transport_tls::{DeviceCredentials, CA_FILE, SERVER_CERT_FILE, SERVER_KEY_FILE};

/// What to install when the binaries are missing.
pub const INSTALL_HINT: &str =
    "install Debian's packages: apt-get install -y mosquitto mosquitto-clients";

/// Why mosquitto could not be started or a file could not be written.
#[derive(Debug, thiserror::Error)]
pub enum MosquittoError {
    /// The `mosquitto` binary is not on PATH (nor in /usr/sbin).
    #[error("`mosquitto` not found; {INSTALL_HINT}")]
    Missing,
    /// Writing the configuration or starting the process failed.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    /// The identity directory lacks a file or a device.
    #[error("identity: {0}")]
    Identity(String),
    /// mosquitto exited before it listened; its last log lines follow.
    #[error("mosquitto exited ({status}) before listening:\n{log}")]
    Exited {
        /// Its exit status.
        status: String,
        /// The last lines it wrote to stderr.
        log: String,
    },
    /// The port did not accept connections in time.
    #[error("mosquitto did not listen on {0} within {1:?}")]
    Timeout(SocketAddr, Duration),
    /// Another process listens on the port mosquitto was to listen on.
    #[error("{0} is another process's listener, not mosquitto's")]
    PortTaken(SocketAddr),
}

impl MosquittoError {
    /// Whether mosquitto could not have its port (taken by another process), so another port may do.
    fn port_clash(&self) -> bool {
        match self {
            MosquittoError::PortTaken(_) => true,
            MosquittoError::Exited { log, .. } => log.contains("Address already in use"),
            _ => false,
        }
    }
}

/// The Unix socket of the `$SYS` listener, in the work directory.
pub const SYS_SOCKET: &str = "sys.sock";

/// Where mosquitto publishes how many messages it dropped (queue full), every `sys_interval` when it changed.
pub const DROPPED_TOPIC: &str = "$SYS/broker/publish/messages/dropped";

/// Find an executable by name on PATH, then in the sbin directories Debian installs daemons into.
pub fn find_binary(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/local/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// A running mosquitto; killed when dropped.
#[derive(Debug)]
pub struct Mosquitto {
    addr: SocketAddr,
    plain: Option<SocketAddr>,
    pid: u32,
    exit: Arc<Exit>,
    log: Arc<Mutex<VecDeque<String>>>,
    config: PathBuf,
    sys: PathBuf,
}

/// The child's exit status (as text) once the launcher thread has reaped it.
#[derive(Debug, Default)]
struct Exit {
    status: Mutex<Option<String>>,
    changed: Condvar,
}

impl Exit {
    fn set(&self, status: std::io::Result<ExitStatus>) {
        let text = match status {
            Ok(s) => s.to_string(),
            Err(e) => e.to_string(),
        };
        *self.status.lock().unwrap_or_else(|e| e.into_inner()) = Some(text);
        self.changed.notify_all();
    }

    fn get(&self) -> Option<String> {
        self.status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn wait(&self, limit: Duration) {
        let guard = self.status.lock().unwrap_or_else(|e| e.into_inner());
        let _ = self
            .changed
            .wait_timeout_while(guard, limit, |s| s.is_none());
    }
}

const LOG_LINES: usize = 50;

/// What [`Mosquitto::start_with`] adds to the reference configuration.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Also listen without TLS on `127.0.0.1:port`, anonymous clients allowed there (tests that speak raw MQTT).
    pub plaintext_port: Option<u16>,
    /// Configuration lines appended as they are (e.g. `max_packet_size 1048576`).
    pub extra: Vec<String>,
}
const START_TIMEOUT: Duration = Duration::from_secs(10);

impl Mosquitto {
    /// Write `work/mosquitto.conf` for a TLS listener on `127.0.0.1:port` with the PKI in `identity`, start
    /// mosquitto and wait until it accepts connections.
    pub async fn start(
        identity: &Path,
        port: u16,
        work: &Path,
    ) -> Result<Mosquitto, MosquittoError> {
        Self::start_with(identity, port, work, &Options::default()).await
    }

    /// [`Mosquitto::start`] with `options` added to the configuration.
    ///
    /// A port given as 0 (the TLS port, or [`Options::plaintext_port`]) is a free port picked here; as a free port
    /// can be taken by another process between being picked and mosquitto binding it, a start that finds its port
    /// taken is tried again on new ports (up to 5 times). A port given is used as it is.
    pub async fn start_with(
        identity: &Path,
        port: u16,
        work: &Path,
        options: &Options,
    ) -> Result<Mosquitto, MosquittoError> {
        const ATTEMPTS: usize = 5;
        let picks = port == 0 || options.plaintext_port == Some(0);
        let pick = |p: u16| if p == 0 { free_port() } else { Ok(p) };
        let mut attempt = 1;
        loop {
            let chosen = Options {
                plaintext_port: options.plaintext_port.map(pick).transpose()?,
                ..options.clone()
            };
            match Self::start_once(identity, pick(port)?, work, &chosen).await {
                Err(e) if picks && e.port_clash() && attempt < ATTEMPTS => attempt += 1,
                other => return other,
            }
        }
    }

    async fn start_once(
        identity: &Path,
        port: u16,
        work: &Path,
        options: &Options,
    ) -> Result<Mosquitto, MosquittoError> {
        let binary = find_binary("mosquitto").ok_or(MosquittoError::Missing)?;
        for file in [CA_FILE, SERVER_CERT_FILE, SERVER_KEY_FILE] {
            if !identity.join(file).is_file() {
                return Err(MosquittoError::Identity(format!(
                    "{} is missing",
                    identity.join(file).display()
                )));
            }
        }
        std::fs::create_dir_all(work)?;
        let identity = std::fs::canonicalize(identity)?;
        let work = std::fs::canonicalize(work)?;
        let sys = work.join(SYS_SOCKET);
        // sockaddr_un holds 108 bytes with the terminating NUL.
        if sys.as_os_str().len() > 107 {
            return Err(MosquittoError::Identity(format!(
                "the work directory's path is too long for a Unix socket: {}",
                sys.display()
            )));
        }
        let _ = std::fs::remove_file(&sys);
        let config = work.join("mosquitto.conf");
        let mut text = config_text(&identity, port, &sys);
        if let Some(plain) = options.plaintext_port {
            // `allow_anonymous true` is already global (see config_text).
            text.push_str(&format!("listener {plain} 127.0.0.1\n"));
        }
        for line in &options.extra {
            text.push_str(line);
            text.push('\n');
        }
        std::fs::write(&config, text)?;

        let log = Arc::new(Mutex::new(VecDeque::new()));
        let (started_tx, started) = mpsc::channel();
        let exit = Arc::new(Exit::default());
        let exit_sink = exit.clone();
        let conf = config.clone();
        let log_sink = log.clone();
        std::thread::Builder::new()
            .name("mosquitto".into())
            .spawn(move || {
                let mut cmd = Command::new(binary);
                cmd.arg("-c")
                    .arg(&conf)
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped());
                set_parent_death_signal(&mut cmd);
                let mut child = match cmd.spawn() {
                    Ok(c) => c,
                    Err(e) => {
                        let _ = started_tx.send(Err(e));
                        return;
                    }
                };
                let _ = started_tx.send(Ok(child.id()));
                if let Some(stderr) = child.stderr.take() {
                    std::thread::spawn(move || {
                        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                            let mut log = log_sink.lock().unwrap_or_else(|e| e.into_inner());
                            if log.len() == LOG_LINES {
                                log.pop_front();
                            }
                            log.push_back(line);
                        }
                    });
                }
                exit_sink.set(child.wait());
            })?;
        let pid = started
            .recv()
            .map_err(|_| std::io::Error::other("launcher thread ended"))??;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let plain = options
            .plaintext_port
            .map(|p| SocketAddr::from(([127, 0, 0, 1], p)));
        let me = Mosquitto {
            addr,
            plain,
            pid,
            exit,
            log,
            config,
            sys,
        };
        me.wait_listening(me.addr).await?;
        if let Some(plain) = plain {
            me.wait_listening(plain).await?;
        }
        Ok(me)
    }

    async fn wait_listening(&self, addr: SocketAddr) -> Result<(), MosquittoError> {
        let start = Instant::now();
        loop {
            if let Some(status) = self.exit.get() {
                // Give the log reader a moment to take the last lines.
                tokio::time::sleep(Duration::from_millis(50)).await;
                return Err(MosquittoError::Exited {
                    status,
                    log: self.log_tail(),
                });
            }
            if tokio::net::TcpStream::connect(addr).await.is_ok() {
                // Something listens there: mosquitto, or another process that took the port first (mosquitto then
                // fails to bind it and exits). Where /proc cannot say, the connection is taken as mosquitto's.
                return match transport_core::procfs::listens_on(self.pid, addr.port()) {
                    Ok(false) if self.is_running() => {
                        // Its listeners open one after another: give it a moment before calling the port taken.
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        match transport_core::procfs::listens_on(self.pid, addr.port()) {
                            Ok(false) => Err(MosquittoError::PortTaken(addr)),
                            _ => Ok(()),
                        }
                    }
                    Ok(false) => Err(MosquittoError::PortTaken(addr)),
                    _ => Ok(()),
                };
            }
            if start.elapsed() > START_TIMEOUT {
                return Err(MosquittoError::Timeout(addr, START_TIMEOUT));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where it listens without TLS, if asked to ([`Options::plaintext_port`]).
    pub fn plain_addr(&self) -> Option<SocketAddr> {
        self.plain
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The configuration file it was started with.
    pub fn config(&self) -> &Path {
        &self.config
    }

    /// The Unix socket of its `$SYS` listener (no TLS, no certificate).
    pub fn sys_socket(&self) -> &Path {
        &self.sys
    }

    /// The last lines it logged.
    pub fn log_tail(&self) -> String {
        let log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        log.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    /// Whether it is still running.
    pub fn is_running(&self) -> bool {
        self.exit.get().is_none()
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        if self.is_running() {
            // SAFETY: plain kill(2) on the child's pid, which the launcher thread has not yet reaped.
            unsafe {
                libc::kill(self.pid as libc::pid_t, libc::SIGKILL);
            }
            self.exit.wait(Duration::from_secs(5));
        }
    }
}

/// The queue bounds mosquitto runs with, written into its configuration: its defaults, stated so that the results
/// say what they were measured with (docs/workloads.md compares them with the in-tree broker's).
///
/// - `max_inflight_messages 20`: QoS 1 messages sent to a client and awaiting PUBACK;
/// - `max_queued_messages 1000`: beyond the in-flight ones, QoS 1 messages queued per client; a QoS 0 message is
///   dropped when the client has this many packets waiting to be written to its socket;
/// - `max_queued_bytes 0`: no byte bound; `queue_qos0_messages false`: nothing queued at QoS 0 for a client that is
///   away. A message that does not fit is dropped and counted in `$SYS/broker/publish/messages/dropped`.
pub const QUEUE_SETTINGS: &str = "max_inflight_messages 20\n\
                                  max_queued_messages 1000\n\
                                  max_queued_bytes 0\n\
                                  queue_qos0_messages false\n";

/// The configuration: loopback only, TLS 1.3, client certificate required and used as the identity; the queue bounds
/// ([`QUEUE_SETTINGS`]); `$SYS` every second, on a Unix socket listener at `sys` as well. `allow_anonymous true` is
/// for that listener only in effect: on the TLS listener every client presents a certificate, whose name is its
/// user name.
pub fn config_text(identity: &Path, port: u16, sys: &Path) -> String {
    let file = |name: &str| identity.join(name).display().to_string();
    let mut text = String::new();
    // As root, mosquitto would switch to the `mosquitto` user and could no longer read the key (mode 0600).
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        text.push_str("user root\n");
    }
    text.push_str(&format!(
        "per_listener_settings false\n\
         persistence false\n\
         log_dest stderr\n\
         log_type error\n\
         log_type warning\n\
         log_type notice\n\
         connection_messages false\n\
         set_tcp_nodelay true\n\
         {QUEUE_SETTINGS}\
         memory_limit 0\n\
         sys_interval 1\n\
         allow_anonymous true\n\
         listener {port} 127.0.0.1\n\
         max_connections -1\n\
         cafile {ca}\n\
         certfile {cert}\n\
         keyfile {key}\n\
         require_certificate true\n\
         use_identity_as_username true\n\
         tls_version tlsv1.3\n\
         listener 0 {sys}\n",
        ca = file(CA_FILE),
        cert = file(SERVER_CERT_FILE),
        key = file(SERVER_KEY_FILE),
        sys = sys.display(),
    ));
    text
}

/// Follow mosquitto's count of dropped messages ([`DROPPED_TOPIC`]) through its `$SYS` listener at `socket`,
/// storing each value into `dropped`, until the connection fails (the error says why).
pub async fn follow_dropped(
    socket: &Path,
    dropped: &std::sync::atomic::AtomicU64,
) -> Result<(), crate::client::ClientError> {
    use crate::client::{connect_packet, ClientError, MqttStream};
    use crate::codec::{Packet, PacketId, QoS, Subscribe};
    // mosquitto opens its listeners one after another: the socket may come a moment after the TCP port.
    let mut tries = 0;
    let unix = loop {
        match tokio::net::UnixStream::connect(socket).await {
            Ok(unix) => break unix,
            Err(_) if tries < 100 => {
                tries += 1;
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            Err(e) => return Err(e.into()),
        }
    };
    let mut stream = MqttStream::new(unix);
    // Keepalive 0: this reader sends nothing after it has subscribed.
    stream
        .connect(connect_packet("lb-sys-reader", true, 0))
        .await?;
    let packet_id = PacketId::new(1).ok_or(ClientError::Closed)?;
    stream
        .send(&Packet::Subscribe(Subscribe {
            packet_id,
            filters: vec![(DROPPED_TOPIC.into(), QoS::AtMostOnce)],
        }))
        .await?;
    loop {
        if let Packet::Publish(p) = stream.recv().await? {
            let value = std::str::from_utf8(&p.payload)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok());
            match value {
                Some(v) if p.topic == DROPPED_TOPIC => {
                    dropped.store(v, std::sync::atomic::Ordering::Relaxed)
                }
                _ => {
                    return Err(ClientError::Unexpected(format!(
                        "{} on {}",
                        String::from_utf8_lossy(&p.payload),
                        p.topic
                    )))
                }
            }
        }
    }
}

/// Ask the kernel to SIGKILL the child when the thread that forks it ends (with it, the owning process).
fn set_parent_death_signal(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// A free TCP port on 127.0.0.1 (bound and released: another process could take it in between, which the
/// start then reports).
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn pem(label: &str, der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).unwrap_or_default());
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// Write device `device`'s certificate and key from `credentials` as `<out>/<name>.crt` and `<out>/<name>.key`
/// (mode 0600) for command-line clients; returns their paths.
pub fn device_pem(
    credentials: &DeviceCredentials,
    device: u32,
    out: &Path,
    name: &str,
) -> Result<(PathBuf, PathBuf), MosquittoError> {
    let (cert, key) = credentials
        .device(device)
        .ok_or_else(|| MosquittoError::Identity(format!("no credentials for device {device}")))?;
    std::fs::create_dir_all(out)?;
    let cert_path = out.join(format!("{name}.crt"));
    let key_path = out.join(format!("{name}.key"));
    std::fs::write(&cert_path, pem("CERTIFICATE", cert.as_ref()))?;
    transport_core::keys::write_secret(
        &key_path,
        pem("PRIVATE KEY", key.secret_pkcs8_der()).as_bytes(),
    )
    .map_err(|e| MosquittoError::Identity(e.to_string()))?;
    Ok((cert_path, key_path))
}
