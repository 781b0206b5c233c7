//! The session files: a restart restores what was made durable, a torn tail is cut, damage stops the start.

use super::*;
use crate::broker::state::{ClientKey, ConnId, SessionLimits};
use crate::codec::{PacketId, QoS};
use bytes::Bytes;
use std::time::Instant;
use transport_core::Counters;

fn state() -> State {
    State::new(
        SessionLimits::default(),
        Arc::new(Counters::default()),
        Instant::now(),
    )
}

/// Open `dir`, run `f` on the state, hand its records over and wait until they are durable; then close.
async fn run(dir: &Path, f: impl FnOnce(&mut State)) -> (State, Recovery) {
    let mut s = state();
    let (mut store, recovery) = SessionStore::open(dir, &mut s).unwrap();
    f(&mut s);
    if let Some(records) = s.take_journal() {
        let seq = store.append(records, || unreachable!("too small to compact"));
        store.durable(seq).await.unwrap();
    }
    store.close().await;
    (s, recovery)
}

fn make_session(s: &mut State) {
    let conn = ConnId(1);
    s.connect(conn, &ClientKey::verified("dev-1"), false, None)
        .unwrap();
    s.subscribe(
        conn,
        PacketId::new(1).unwrap(),
        &[("t/#".into(), QoS::ExactlyOnce)],
    )
    .unwrap();
    s.disconnect(conn, true);
    s.publish("t/1", Bytes::from_static(b"kept"), QoS::ExactlyOnce, false);
}

#[tokio::test]
async fn sessions_survive_a_restart_and_the_journal_is_folded_into_the_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let (first, recovery) = run(dir.path(), make_session).await;
    assert_eq!(
        recovery,
        Recovery {
            generation: 1,
            ..Recovery::default()
        }
    );
    let (second, recovery) = run(dir.path(), |_| {}).await;
    assert_eq!(second.snapshot(), first.snapshot());
    assert_eq!((recovery.generation, recovery.snapshot_records), (2, 1));
    assert!(recovery.journal_records >= 4, "{recovery:?}");
    // The third start finds it all in the snapshot.
    let (third, recovery) = run(dir.path(), |_| {}).await;
    assert_eq!(third.snapshot(), first.snapshot());
    assert_eq!(recovery.journal_records, 0);
    assert_eq!(third.stats().sessions, 1);
}

#[tokio::test]
async fn a_torn_journal_tail_is_cut_and_damage_before_valid_records_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let (first, _) = run(dir.path(), make_session).await;
    let log = dir.path().join(JOURNAL_FILE);
    let whole = std::fs::read(&log).unwrap();
    // Torn: the last record cut short. Nothing in it was acknowledged; the rest is restored.
    std::fs::write(&log, &whole[..whole.len() - 3]).unwrap();
    let (torn, recovery) = run(dir.path(), |_| {}).await;
    assert!(recovery.truncated_bytes > 0);
    assert_eq!(torn.stats().sessions, 1);
    assert_ne!(torn.snapshot(), first.snapshot(), "the torn record is gone");

    // Damage in the middle, valid records after it: a clear error, no panic, nothing started.
    let dir = tempfile::tempdir().unwrap();
    run(dir.path(), make_session).await;
    let log = dir.path().join(JOURNAL_FILE);
    let mut damaged = std::fs::read(&log).unwrap();
    damaged[HEADER + FRAME_HEADER_FOR_TEST] ^= 0xff;
    std::fs::write(&log, &damaged).unwrap();
    let err = SessionStore::open(dir.path(), &mut state()).unwrap_err();
    assert!(
        matches!(err, PersistError::Corrupt { offset, .. } if offset == HEADER as u64),
        "{err}"
    );
    assert!(err.to_string().contains("mqtt-sessions.log"), "{err}");

    // A damaged snapshot (it is written whole, so any damage is corruption).
    let dir = tempfile::tempdir().unwrap();
    run(dir.path(), make_session).await;
    run(dir.path(), |_| {}).await;
    let snap = dir.path().join(SNAPSHOT_FILE);
    let mut damaged = std::fs::read(&snap).unwrap();
    let last = damaged.len() - 1;
    damaged[last] ^= 0x01;
    std::fs::write(&snap, &damaged).unwrap();
    assert!(matches!(
        SessionStore::open(dir.path(), &mut state()),
        Err(PersistError::Corrupt { .. })
    ));
    std::fs::write(&snap, b"something else entirely").unwrap();
    assert!(matches!(
        SessionStore::open(dir.path(), &mut state()),
        Err(PersistError::Corrupt { offset: 0, .. })
    ));
}

const FRAME_HEADER_FOR_TEST: usize = journal::FRAME_HEADER;

#[tokio::test]
async fn a_journal_older_than_the_snapshot_is_not_replayed_twice() {
    let dir = tempfile::tempdir().unwrap();
    let (first, _) = run(dir.path(), make_session).await;
    let log = dir.path().join(JOURNAL_FILE);
    let old_journal = std::fs::read(&log).unwrap();
    // A compaction that wrote its snapshot but crashed before resetting the journal.
    run(dir.path(), |_| {}).await;
    std::fs::write(&log, &old_journal).unwrap();
    let (s, recovery) = run(dir.path(), |_| {}).await;
    assert_eq!(recovery.journal_records, 0);
    assert_eq!(s.snapshot(), first.snapshot());
}

#[tokio::test]
async fn one_broker_per_state_directory() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = state();
    let (store, _) = SessionStore::open(dir.path(), &mut s).unwrap();
    assert!(matches!(
        SessionStore::open(dir.path(), &mut state()),
        Err(PersistError::Locked(_))
    ));
    store.close().await;
    SessionStore::open(dir.path(), &mut state()).unwrap();
}

#[tokio::test]
async fn a_growing_journal_is_compacted_into_a_new_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = state();
    let (mut store, _) = SessionStore::open(dir.path(), &mut s).unwrap();
    make_session(&mut s);
    let conn = ConnId(2);
    s.connect(conn, &ClientKey::verified("dev-1"), false, None)
        .unwrap();
    let payload = Bytes::from(vec![7u8; 1 << 20]);
    let mut compactions = 0;
    for _ in 0..20 {
        // A 1 MiB message delivered and acknowledged: the journal grows, the state does not.
        s.publish("t/x", payload.clone(), QoS::AtLeastOnce, false);
        let mut out = bytes::BytesMut::new();
        s.poll_transmit(conn, &mut out, usize::MAX);
        while let Some(p) = crate::codec::read_packet(&mut out, usize::MAX).unwrap() {
            if let crate::codec::Packet::Publish(p) = p {
                s.puback(conn, p.packet_id.unwrap());
            }
        }
        let records = s.take_journal().unwrap();
        let seq = store.append(records, || {
            compactions += 1;
            s.snapshot()
        });
        store.durable(seq).await.unwrap();
    }
    store.close().await;
    assert!(compactions >= 1, "{compactions}");
    let log_len = std::fs::metadata(dir.path().join(JOURNAL_FILE))
        .unwrap()
        .len();
    assert!(log_len < 20 << 20, "the journal was reset: {log_len}");
    let (restored, _) = run(dir.path(), |_| {}).await;
    assert_eq!(restored.snapshot(), s.snapshot());
}

#[tokio::test]
async fn the_session_files_are_private_and_never_written_through_a_planted_symlink() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let dir = tempfile::tempdir().unwrap();
    let state_dir = dir.path().join("state");
    std::fs::create_dir(&state_dir).unwrap();
    // Someone who could write the directory planted the temporary snapshot's name, pointing at a file of theirs,
    // and left a journal readable by everyone.
    let victim = dir.path().join("victim");
    std::fs::write(&victim, b"keep me").unwrap();
    std::os::unix::fs::symlink(&victim, state_dir.join(format!("{SNAPSHOT_FILE}.tmp"))).unwrap();
    let journal = state_dir.join(JOURNAL_FILE);
    std::fs::write(&journal, b"").unwrap();
    std::fs::set_permissions(&journal, std::fs::Permissions::from_mode(0o644)).unwrap();
    run(&state_dir, make_session).await;
    assert_eq!(std::fs::read(&victim).unwrap(), b"keep me");
    assert_eq!(mode(&victim), 0o644, "the target's mode is untouched");
    for file in [SNAPSHOT_FILE, JOURNAL_FILE] {
        let path = state_dir.join(file);
        assert!(!std::fs::symlink_metadata(&path)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(mode(&path), 0o600, "{file}");
    }
    assert!(!state_dir.join(format!("{SNAPSHOT_FILE}.tmp")).exists());
    // The sessions written that way come back.
    let (s, recovery) = run(&state_dir, |_| {}).await;
    assert!(recovery.snapshot_records > 0);
    assert_eq!(s.stats().sessions, 1);
    // A symlink in place of the journal is refused, not followed.
    let other = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(&victim, other.path().join(JOURNAL_FILE)).unwrap();
    assert!(matches!(
        SessionStore::open(other.path(), &mut state()),
        Err(PersistError::Io { .. })
    ));
    assert_eq!(std::fs::read(&victim).unwrap(), b"keep me");
}

/// Every sync of the session files is timed: the three of opening (snapshot, directory, journal header) and one per
/// group of records written, and nothing when nothing was written.
#[tokio::test]
async fn every_sync_of_the_session_files_is_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let syncs = Arc::new(StateSyncs::default());
    let mut s = state();
    let (mut store, _) = SessionStore::open_recording(dir.path(), &mut s, syncs.clone()).unwrap();
    assert_eq!(syncs.count(), 3, "snapshot, directory, journal header");
    make_session(&mut s);
    let records = s.take_journal().unwrap();
    let seq = store.append(records, || unreachable!("too small to compact"));
    store.durable(seq).await.unwrap();
    assert_eq!(syncs.count(), 4, "one group, one fdatasync");
    store.close().await;
    assert_eq!(syncs.count(), 4, "closing writes nothing more");
    assert!(syncs.histogram().max() >= 1);
}
