//! The store: committing one order with sync none, as a server's group of one.
//!
//! Counted: [`Store::commit`] for one 64-byte order: the payload-size check, the exactly-once set's insert (its
//! occasional growth amortised over the steps, which is why a comparison needs the same step count), the commit
//! time read, the record's encoding and CRC-32, and the user-space side of the one `write` to the log file.
//! Not counted: the kernel's work for that `write` (callgrind sees user space only; the copy into the page cache
//! is usually the larger part), any sync (policy none), and the store thread and channel of `StoreHandle`.

use crate::meter::Meter;
use anyhow::ensure;
use transport_core::order::fill_payload;
use transport_core::{Order, OrderId};
use transport_store::{Outcome, Store, SyncPolicy};

/// `store/append`.
pub fn append(m: &Meter) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (mut store, _) = Store::open(dir.path(), SyncPolicy::None)?;
    m.run(|seq, s| {
        let id = OrderId {
            sender: 0,
            run: 1,
            seq,
        };
        let mut payload = Vec::with_capacity(super::pure::PAYLOAD);
        fill_payload(&id, super::pure::PAYLOAD, &mut payload);
        let order = Order {
            id,
            made_us: 1_790_000_000_000_000,
            payload,
        };
        let outcomes = s.measure(|| store.commit(std::slice::from_ref(&order)))?;
        ensure!(outcomes == [Outcome::Applied]);
        Ok(())
    })
}
