//! The store against real files in temporary directories, with real fsync.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::Path;
use transport_core::order::{Order, OrderId, MAX_PAYLOAD};
use transport_store::{
    audit, read_log, Outcome, Store, StoreError, StoreHandle, SyncPolicy, LOG_FILE,
};

fn id(sender: u64, seq: u64) -> OrderId {
    OrderId {
        sender,
        run: 0x5eed,
        seq,
    }
}

fn order(sender: u64, seq: u64) -> Order {
    Order {
        id: id(sender, seq),
        made_us: 1_700_000_000_000_000 + seq,
        payload: vec![seq as u8; (seq % 50) as usize],
    }
}

fn orders(sender: u64, seqs: std::ops::Range<u64>) -> Vec<Order> {
    seqs.map(|s| order(sender, s)).collect()
}

fn log_len(dir: &Path) -> u64 {
    fs::metadata(dir.join(LOG_FILE)).unwrap().len()
}

fn append_raw(dir: &Path, bytes: &[u8]) {
    let mut f = OpenOptions::new()
        .append(true)
        .open(dir.join(LOG_FILE))
        .unwrap();
    f.write_all(bytes).unwrap();
}

/// Write `orders` into a fresh store in `dir` and close it.
fn fill(dir: &Path, orders: &[Order]) {
    let (mut store, _) = Store::open(dir, SyncPolicy::Batch).unwrap();
    store.commit(orders).unwrap();
}

#[test]
fn round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let (mut store, recovery) = Store::open(dir.path(), SyncPolicy::Batch).unwrap();
    assert_eq!((recovery.records, recovery.truncated_bytes), (0, 0));
    let batch = orders(1, 0..20);
    let outcomes = store.commit(&batch).unwrap();
    assert!(outcomes.iter().all(|o| *o == Outcome::Applied));
    assert_eq!(store.applied(), 20);
    let stats = store.stats();
    assert_eq!((stats.applied, stats.groups, stats.syncs), (20, 1, 1));
    assert_eq!(stats.bytes, log_len(dir.path()));

    let entries = read_log(dir.path()).unwrap();
    assert_eq!(entries.len(), 20);
    for (e, o) in entries.iter().zip(&batch) {
        assert_eq!(e.id, o.id);
        assert_eq!(e.made_us, o.made_us);
        assert_eq!(usize::from(e.payload_len), o.payload.len());
        assert!(e.stored_us >= o.made_us);
    }
    // One group, one commit time.
    assert!(entries.iter().all(|e| e.stored_us == entries[0].stored_us));
}

#[test]
fn repeats_are_applied_once() {
    let dir = tempfile::tempdir().unwrap();
    let (mut store, _) = Store::open(dir.path(), SyncPolicy::Batch).unwrap();
    let group = vec![order(1, 0), order(1, 1), order(1, 0)];
    assert_eq!(
        store.commit(&group).unwrap(),
        [Outcome::Applied, Outcome::Applied, Outcome::AlreadyApplied]
    );
    assert_eq!(
        store.commit(&[order(1, 1), order(1, 2)]).unwrap(),
        [Outcome::AlreadyApplied, Outcome::Applied]
    );
    assert_eq!(read_log(dir.path()).unwrap().len(), 3);
    assert_eq!(store.stats().already_applied, 2);
}

#[test]
fn reopen_rebuilds_the_index() {
    let dir = tempfile::tempdir().unwrap();
    fill(dir.path(), &orders(3, 0..10));
    let (mut store, recovery) = Store::open(dir.path(), SyncPolicy::Batch).unwrap();
    assert_eq!((recovery.records, recovery.truncated_bytes), (10, 0));
    assert_eq!(store.applied(), 10);
    assert_eq!(store.stats().recovered, 10);
    assert_eq!(
        store.commit(&[order(3, 4), order(3, 10)]).unwrap(),
        [Outcome::AlreadyApplied, Outcome::Applied]
    );
    drop(store);
    assert_eq!(read_log(dir.path()).unwrap().len(), 11);
}

#[test]
fn oversized_payload_is_refused_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    let (mut store, _) = Store::open(dir.path(), SyncPolicy::Batch).unwrap();
    let mut big = order(1, 1);
    big.payload = vec![0; MAX_PAYLOAD + 1];
    let err = store.commit(&[order(1, 0), big]).unwrap_err();
    assert!(matches!(err, StoreError::PayloadTooLarge { .. }), "{err}");
    assert_eq!(log_len(dir.path()), 0);
    // Not a failure of the store: it keeps working.
    assert_eq!(store.commit(&[order(1, 0)]).unwrap(), [Outcome::Applied]);
}

#[test]
fn partial_record_at_the_end_is_cut_off() {
    let dir = tempfile::tempdir().unwrap();
    fill(dir.path(), &orders(1, 0..5));
    let good = log_len(dir.path());
    // A crash in the middle of writing a record: a header and part of a body.
    append_raw(dir.path(), &[60, 0, 0, 0, 1, 2, 3, 4, 9, 9, 9]);
    assert_eq!(
        read_log(dir.path()).unwrap().len(),
        5,
        "read_log stops at the tail"
    );
    assert_eq!(
        log_len(dir.path()),
        good + 11,
        "read_log does not modify the file"
    );

    let (mut store, recovery) = Store::open(dir.path(), SyncPolicy::Batch).unwrap();
    assert_eq!((recovery.records, recovery.truncated_bytes), (5, 11));
    assert_eq!(log_len(dir.path()), good);
    assert_eq!(store.commit(&[order(1, 5)]).unwrap(), [Outcome::Applied]);
    drop(store);
    let ids: Vec<_> = read_log(dir.path())
        .unwrap()
        .iter()
        .map(|e| e.id.seq)
        .collect();
    assert_eq!(ids, [0, 1, 2, 3, 4, 5]);
}

#[test]
fn zeroed_tail_is_cut_off() {
    let dir = tempfile::tempdir().unwrap();
    fill(dir.path(), &orders(1, 0..3));
    let good = log_len(dir.path());
    // The file grew but the data never reached the disk.
    append_raw(dir.path(), &[0; 4096]);
    let (_store, recovery) = Store::open(dir.path(), SyncPolicy::Batch).unwrap();
    assert_eq!((recovery.records, recovery.truncated_bytes), (3, 4096));
    assert_eq!(log_len(dir.path()), good);
}

#[test]
fn flipped_byte_in_the_last_record_is_cut_off() {
    let dir = tempfile::tempdir().unwrap();
    fill(dir.path(), &orders(2, 0..4));
    let before_last = {
        let entries = read_log(dir.path()).unwrap();
        assert_eq!(entries.len(), 4);
        log_len(dir.path()) - (8 + 42 + u64::from(entries[3].payload_len))
    };
    let path = dir.path().join(LOG_FILE);
    let mut bytes = fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    fs::write(&path, &bytes).unwrap();

    let (mut store, recovery) = Store::open(dir.path(), SyncPolicy::Batch).unwrap();
    assert_eq!(recovery.records, 3);
    assert_eq!(log_len(dir.path()), before_last);
    assert_eq!(recovery.truncated_bytes, bytes.len() as u64 - before_last);
    // The cut-off order was never acknowledged; it is applied when it comes again.
    assert_eq!(
        store.commit(&[order(2, 3), order(2, 0)]).unwrap(),
        [Outcome::Applied, Outcome::AlreadyApplied]
    );
    drop(store);
    assert_eq!(read_log(dir.path()).unwrap().len(), 4);
}

#[test]
fn damage_in_the_middle_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    fill(dir.path(), &orders(1, 0..6));
    let path = dir.path().join(LOG_FILE);
    let mut bytes = fs::read(&path).unwrap();
    // Inside the second record's body (the first record has an empty payload: 50 bytes).
    bytes[50 + 20] ^= 0x01;
    fs::write(&path, &bytes).unwrap();

    for err in [
        Store::open(dir.path(), SyncPolicy::Batch).unwrap_err(),
        read_log(dir.path()).unwrap_err(),
    ] {
        match err {
            StoreError::Corrupt {
                offset, next_valid, ..
            } => {
                assert_eq!(offset, 50);
                assert!(next_valid > offset);
            }
            other => panic!("expected Corrupt, got {other}"),
        }
    }
    assert_eq!(fs::read(&path).unwrap(), bytes, "nothing was cut off");
}

#[test]
fn damaged_length_in_the_middle_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    fill(dir.path(), &orders(1, 0..6));
    let path = dir.path().join(LOG_FILE);
    let mut bytes = fs::read(&path).unwrap();
    // The second record's length now reaches past the end of the file: it looks torn, but valid records follow.
    bytes[50 + 1] = 0x10;
    fs::write(&path, &bytes).unwrap();
    let err = Store::open(dir.path(), SyncPolicy::Batch).unwrap_err();
    assert!(
        matches!(err, StoreError::Corrupt { offset: 50, .. }),
        "{err}"
    );
}

#[test]
fn every_sync_policy_stores() {
    for (policy, syncs) in [
        (SyncPolicy::None, 0),
        (SyncPolicy::Batch, 2),
        (SyncPolicy::Each, 8),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (mut store, _) = Store::open(dir.path(), policy).unwrap();
        store.commit(&orders(1, 0..5)).unwrap();
        // Two repeats cost no write and no sync.
        store.commit(&orders(1, 3..8)).unwrap();
        let stats = store.stats();
        assert_eq!((stats.applied, stats.already_applied), (8, 2), "{policy}");
        assert_eq!(stats.syncs, syncs, "{policy}");
        assert_eq!(stats.bytes, log_len(dir.path()), "{policy}");
        drop(store);
        assert_eq!(read_log(dir.path()).unwrap().len(), 8, "{policy}");
    }
}

#[test]
fn a_second_open_fails_while_the_first_is_open() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = Store::open(dir.path(), SyncPolicy::Batch).unwrap();
    let err = Store::open(dir.path(), SyncPolicy::Batch).unwrap_err();
    assert!(matches!(err, StoreError::Locked { .. }), "{err}");
    assert!(
        err.to_string().contains("in use by another server"),
        "{err}"
    );
    drop(store);
    Store::open(dir.path(), SyncPolicy::Batch).unwrap();
}

/// The policies a [`StoreHandle`] is tested under: one writes on the store's thread (it syncs), one on the
/// committing tasks' own threads (it never syncs).
const HANDLE_POLICIES: [SyncPolicy; 2] = [SyncPolicy::Batch, SyncPolicy::None];

/// Commits from many tasks at once, each order twice: every order applied once, in fewer groups than commits.
async fn group_commit_across_tasks(policy: SyncPolicy) {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = Store::open(dir.path(), policy).unwrap();
    let handle = StoreHandle::spawn(store);
    let (tasks, per_task) = (32u64, 40u64);
    let mut joins = Vec::new();
    for t in 0..tasks {
        let handle = handle.clone();
        joins.push(tokio::spawn(async move {
            let mut applied = 0;
            for seq in 0..per_task {
                // Every order is sent twice, once alone and once with its neighbour: each is applied once.
                let a = handle.commit(vec![order(t, seq)]).await.unwrap();
                let b = handle
                    .commit(vec![order(t, seq), order(t, seq + 1)])
                    .await
                    .unwrap();
                applied += [a, b]
                    .concat()
                    .iter()
                    .filter(|o| **o == Outcome::Applied)
                    .count() as u64;
            }
            applied
        }));
    }
    let mut applied = 0;
    for j in joins {
        applied += j.await.unwrap();
    }
    let commits = tasks * per_task * 2;
    assert_eq!(applied, tasks * (per_task + 1), "{policy}");
    assert_eq!(handle.applied(), applied);
    let stats = handle.stats();
    assert_eq!(stats.applied, applied);
    assert!(
        stats.groups < commits,
        "{policy}: {} groups for {commits} commits: no grouping",
        stats.groups
    );
    // At most one sync per group (a group of repeats only writes and syncs nothing); none without syncing.
    assert!(stats.syncs <= stats.groups);
    if policy == SyncPolicy::None {
        assert_eq!(stats.syncs, 0);
    }
    handle.close().await;
    let entries = read_log(dir.path()).unwrap();
    assert_eq!(entries.len() as u64, applied);
    let made: Vec<_> = (0..tasks)
        .flat_map(|t| (0..=per_task).map(move |s| id(t, s)))
        .collect();
    let a = audit(dir.path(), &made, &made).unwrap();
    assert!(a.is_clean(), "{policy}: {a:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn group_commit_across_tasks_on_many_threads() {
    for policy in HANDLE_POLICIES {
        group_commit_across_tasks(policy).await;
    }
}

/// A server with one thread runs every connection's task on it: commits written inline still group.
#[tokio::test(flavor = "current_thread")]
async fn group_commit_across_tasks_on_one_thread() {
    for policy in HANDLE_POLICIES {
        group_commit_across_tasks(policy).await;
    }
}

#[tokio::test]
async fn closing_releases_the_lock() {
    for policy in HANDLE_POLICIES {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = Store::open(dir.path(), policy).unwrap();
        let handle = StoreHandle::spawn(store);
        let other = handle.clone();
        handle.commit(orders(1, 0..3)).await.unwrap();
        handle.close().await;
        assert!(
            matches!(other.commit(orders(1, 3..4)).await, Err(StoreError::Closed)),
            "{policy}"
        );
        let (_store, recovery) = Store::open(dir.path(), SyncPolicy::Batch).unwrap();
        assert_eq!(recovery.records, 3, "{policy}");
    }
}

#[tokio::test]
async fn a_failed_write_fails_every_later_commit() {
    for policy in HANDLE_POLICIES {
        let dir = tempfile::tempdir().unwrap();
        // Every write to /dev/full fails with ENOSPC.
        std::os::unix::fs::symlink("/dev/full", dir.path().join(LOG_FILE)).unwrap();
        let (store, recovery) = Store::open(dir.path(), policy).unwrap();
        assert_eq!(recovery.records, 0);
        let handle = StoreHandle::spawn(store);
        let first = handle.commit(orders(1, 0..2)).await.unwrap_err();
        assert!(
            first.to_string().contains("No space left"),
            "{policy}: {first}"
        );
        for seq in 2..4 {
            let err = handle.commit(orders(1, seq..seq + 1)).await.unwrap_err();
            assert!(matches!(err, StoreError::Failed { .. }), "{policy}: {err}");
        }
        assert_eq!(handle.stats().applied, 0, "{policy}");
        // Releases the lock, which is on /dev/full itself, for the next policy's store.
        handle.close().await;
    }
}

/// Written inline, the first commit of a turn writes the group the others join. Cancelled before it writes (its
/// connection gone), it still writes the group, so the commits that joined it are answered, not left waiting.
#[tokio::test(flavor = "current_thread")]
async fn a_cancelled_leader_still_writes_its_group() {
    use std::future::Future;
    use std::task::{Context, Poll, Waker};
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = Store::open(dir.path(), SyncPolicy::None).unwrap();
    let handle = StoreHandle::spawn(store);
    let mut cx = Context::from_waker(Waker::noop());
    let mut leader = Box::pin(handle.commit(orders(1, 0..2)));
    let mut joined = Box::pin(handle.commit(orders(2, 0..1)));
    // The leader yields before writing; the second commit joins its group.
    assert!(leader.as_mut().poll(&mut cx).is_pending());
    assert!(joined.as_mut().poll(&mut cx).is_pending());
    assert_eq!(handle.stats().groups, 0);
    drop(leader);
    // Answered without anything else running: the cancelled leader wrote the group as it was dropped.
    let Poll::Ready(outcome) = joined.as_mut().poll(&mut cx) else {
        panic!("the commit that joined a cancelled leader was left waiting");
    };
    assert_eq!(outcome.unwrap(), vec![Outcome::Applied]);
    assert_eq!((handle.stats().groups, handle.stats().applied), (1, 3));
    // The next commit leads a group of its own.
    assert_eq!(
        handle.commit(orders(2, 1..2)).await.unwrap(),
        vec![Outcome::Applied]
    );
    handle.close().await;
    assert_eq!(read_log(dir.path()).unwrap().len(), 4);
}

#[test]
fn audit_reads_the_log() {
    let dir = tempfile::tempdir().unwrap();
    fill(dir.path(), &orders(1, 0..5));
    // A second store writing the same ids (as a broken server would) leaves duplicate records.
    let mut dup = Vec::new();
    {
        let other = tempfile::tempdir().unwrap();
        fill(other.path(), &[order(1, 2), order(1, 3), order(9, 0)]);
        dup.extend(fs::read(other.path().join(LOG_FILE)).unwrap());
    }
    append_raw(dir.path(), &dup);

    // made: seqs 0..6 of sender 1 (seq 5 never stored); acked: 0..3 and 5 (5 is a broken promise).
    let made: Vec<_> = (0..6).map(|s| id(1, s)).collect();
    let acked = [id(1, 0), id(1, 1), id(1, 2), id(1, 5)];
    let a = audit(dir.path(), &made, &acked).unwrap();
    assert_eq!(a.made, 6);
    assert_eq!(a.acked, 4);
    assert_eq!(a.log_records, 8);
    assert_eq!(a.applied, 6, "distinct ids in the log");
    assert_eq!(a.lost, 1);
    assert_eq!(a.acked_not_applied, 1);
    assert_eq!(a.duplicates, 2);
    assert_eq!(a.unknown, 1);
    assert!(!a.is_clean());

    // The store itself refuses nothing here: duplicates are counted at open, not fatal.
    let (_store, recovery) = Store::open(dir.path(), SyncPolicy::Batch).unwrap();
    assert_eq!((recovery.records, recovery.duplicates), (8, 2));

    let json = serde_json::to_string(&a).unwrap();
    let back: transport_store::Audit = serde_json::from_str(&json).unwrap();
    assert_eq!(back, a);
}

#[test]
fn read_log_of_a_missing_store_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let err = read_log(&dir.path().join("nowhere")).unwrap_err();
    assert!(matches!(err, StoreError::Io { .. }), "{err}");
}
