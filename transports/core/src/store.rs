//! PLACEHOLDER: being written. API below is the contract.
use crate::order::{Order, OrderId};
use serde::{Deserialize, Serialize};
use std::path::Path;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum SyncPolicy { None, #[default] Batch, Each }

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("i/o on {path}: {source}")]
    Io { path: std::path::PathBuf, source: std::io::Error },
    #[error("the store's writer has stopped")]
    Closed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome { Applied, AlreadyApplied }

pub struct Store;
#[derive(Debug, Clone, Default)]
pub struct Recovery { pub records: u64, pub truncated_bytes: u64 }
impl Store {
    pub fn open(_dir: &Path, _policy: SyncPolicy) -> Result<(Store, Recovery), StoreError> { unimplemented!() }
    pub fn commit(&mut self, _orders: &[Order]) -> Result<Vec<Outcome>, StoreError> { unimplemented!() }
}
#[derive(Clone)]
pub struct StoreHandle;
impl StoreHandle {
    pub fn spawn(_store: Store) -> StoreHandle { unimplemented!() }
    pub async fn commit(&self, _orders: Vec<Order>) -> Result<Vec<Outcome>, StoreError> { unimplemented!() }
}
pub fn audit(_dir: &Path, _made: &[OrderId], _acked: &[OrderId]) -> Result<Audit, StoreError> { unimplemented!() }
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Audit { pub made: u64, pub acked: u64, pub applied: u64, pub lost: u64, pub acked_not_applied: u64, pub duplicates: u64, pub unknown: u64 }
