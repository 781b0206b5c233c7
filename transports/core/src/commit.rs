//! The seam between a server and the durable store: a server hands the orders it receives to an [`OrderStore`] and
//! answers "stored" only after the commit resolves.
//!
//! The store itself (log format, group commit, recovery, audit) is the `transport-store` crate; keeping only this
//! interface here lets a transport's server be written, and tested, without depending on how orders are kept.

use crate::order::{Order, OrderId, MAX_PAYLOAD};
use crate::transport::BoxFuture;
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What a commit did with one order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// Written now and synced as the store's policy says.
    Applied,
    /// Its id was applied before (or earlier in the same group); nothing written. It is stored all the same.
    AlreadyApplied,
}

/// Why a commit did not make orders durable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommitError {
    /// This order can never be stored (the rest of its group is unaffected); answer it as refused.
    #[error("order {id}: payload of {len} bytes is larger than the limit of {MAX_PAYLOAD}")]
    PayloadTooLarge {
        /// The order.
        id: OrderId,
        /// Its payload length.
        len: usize,
    },
    /// The store failed (a write or sync, or it has stopped): nothing of this commit is durable, and nothing may
    /// be answered as stored. The device may send the order again.
    #[error("the store failed: {0}")]
    Failed(String),
}

/// Where a server commits the orders it receives.
pub trait OrderStore: Send + Sync + 'static {
    /// Commit `orders`: resolves once they are durable as the store's sync policy says, with one [`Outcome`] per
    /// order in order, or with the reason none of them may be answered as stored.
    fn commit(&self, orders: Vec<Order>) -> BoxFuture<'static, Result<Vec<Outcome>, CommitError>>;
}

/// A store shared by every connection of a server.
pub type SharedStore = std::sync::Arc<dyn OrderStore>;

/// The payloads of `orders` checked against [`MAX_PAYLOAD`]: the first that is too large is the error.
pub fn check_payloads(orders: &[Order]) -> Result<(), CommitError> {
    match orders.iter().find(|o| o.payload.len() > MAX_PAYLOAD) {
        Some(o) => Err(CommitError::PayloadTooLarge {
            id: o.id,
            len: o.payload.len(),
        }),
        None => Ok(()),
    }
}

/// The syncs of a server's own durable state beside the order store (the MQTT broker's persistent sessions): each
/// `fsync` or `fdatasync`'s time, recorded where it returns, in an HDR histogram of microseconds that the runner's
/// `stats` answer carries (`state_fsync` in a result). A server that keeps no state of its own records nothing.
#[derive(Debug)]
pub struct StateSyncs {
    us: Mutex<Histogram<u64>>,
}

/// The longest sync the histogram holds apart (60 s); a longer one counts as 60 s.
const MAX_SYNC_US: u64 = 60_000_000;

impl Default for StateSyncs {
    fn default() -> Self {
        StateSyncs {
            us: Mutex::new(Histogram::new_with_bounds(1, MAX_SYNC_US, 3).expect("valid bounds")),
        }
    }
}

impl StateSyncs {
    /// Run `sync` (one `fsync` or `fdatasync`) and record how long it took, whether it failed or not.
    pub fn time<T>(&self, sync: impl FnOnce() -> std::io::Result<T>) -> std::io::Result<T> {
        let start = Instant::now();
        let result = sync();
        self.record(start.elapsed());
        result
    }

    /// Record one sync that took `took`.
    pub fn record(&self, took: Duration) {
        let us = u64::try_from(took.as_micros()).unwrap_or(MAX_SYNC_US);
        self.lock().saturating_record(us.clamp(1, MAX_SYNC_US));
    }

    /// Syncs recorded so far.
    pub fn count(&self) -> u64 {
        self.lock().len()
    }

    /// A copy of the histogram (µs).
    pub fn histogram(&self) -> Histogram<u64> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Histogram<u64>> {
        // A histogram is never left half-updated by a panic elsewhere: keep using it.
        self.us
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
