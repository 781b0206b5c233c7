//! The normative statements of MQTT 3.1.1 (OASIS Standard, 29 October 2014, Appendix B) that bind a server, one
//! test each (a few grouped where one exchange shows several), named by the statement's identifier, and each run
//! against the in-tree broker (`…::in_tree`) and against Debian's mosquitto 2.x (`…::mosquitto`).
//!
//! The mosquitto tests need Debian's `mosquitto` (`apt-get install -y mosquitto`); without it they fail saying so,
//! unless `LB_SKIP_MOSQUITTO=1`, when they print a loud SKIPPED line and pass.
//!
//! Every test starts its own broker with a plaintext listener and speaks raw MQTT to it (malformed packets are
//! written byte by byte); a test that needs a certificate uses the TLS listener. Where mosquitto behaves otherwise,
//! the test says so at that point (`// mosquitto deviates:` or `// mosquitto differs, as the statement allows:`)
//! and asserts what mosquitto actually does.
//!
//! Sections: [`connect`] (1.5.3 in CONNECT, 3.1, 3.2, 3.12, 3.14), [`publish`] (1.5.3, 2.2.2, 2.3.1, 3.3, 3.6),
//! [`subscribe`] (3.8, 3.9, 3.10), [`delivery`] (4.1 to 4.6), [`topics`] (4.7, 4.8, 7).
//!
//! Statements that bind only a client, or a feature neither broker offers here, have no test; docs/mqtt.md lists
//! them with the reason:
//!
//! - client only: MQTT-2.3.1-2, MQTT-2.3.1-3 (a client's packet identifiers), MQTT-3.1.2-23 (a client's
//!   keepalive), MQTT-3.1.3-7 (a client's empty identifier; the server's side is MQTT-3.1.3-8), MQTT-3.14.4-1 and
//!   MQTT-3.14.4-2 (a client after DISCONNECT), MQTT-4.5.0-2 (a client's acknowledgements), MQTT-7.1.2-1 (a
//!   client's transport);
//! - WebSocket, which neither broker is configured for: MQTT-6.0.0-1 to MQTT-6.0.0-4;
//! - bridging (a server that also connects out to servers), which neither does: MQTT-7.0.0-1.
//!
//! MQTT-4.6.0-1 to MQTT-4.6.0-4 are written as rules for a client; MQTT-4.6.0-6 makes them the server's when it
//! delivers, so they are tested as the server's.

mod common;

/// One test per broker for each statement function given: `name::in_tree` and `name::mosquitto`.
macro_rules! normative {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn in_tree() {
                super::$name(super::Kind::InTree).await
            }
                        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn mosquitto() {
                if crate::common::mosquitto_available(stringify!($name), &["mosquitto"]) {
                    super::$name(super::Kind::Mosquitto).await
                }
            }
        }
    )*};
}

#[path = "normative/connect.rs"]
mod connect;
#[path = "normative/delivery.rs"]
mod delivery;
#[path = "normative/harness.rs"]
mod harness;
#[path = "normative/publish.rs"]
mod publish;
#[path = "normative/subscribe.rs"]
mod subscribe;
#[path = "normative/topics.rs"]
mod topics;
