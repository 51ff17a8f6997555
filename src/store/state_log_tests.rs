use super::*;
use proptest::prelude::*;

fn dir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("sluice-state-log-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn record(i: usize) -> Vec<u8> {
    format!("record {i}: {}", "x".repeat(i % 7)).into_bytes()
}

/// A file of `n` records in memory, and where each record's frame begins.
fn file_of(tag: &str, n: usize) -> (Vec<u8>, Vec<usize>) {
    let d = dir(tag);
    let path = d.join("state.log");
    let mut w = Writer::create(&path, "node-a", 42, u64::MAX).unwrap();
    let mut starts = Vec::new();
    for i in 0..n {
        starts.push(w.written() as usize);
        w.append(&record(i)).unwrap();
    }
    w.sync().unwrap();
    let bytes = std::fs::read(&path).unwrap();
    std::fs::remove_dir_all(&d).ok();
    (bytes, starts)
}

#[test]
fn what_is_written_is_read_back_with_its_header() {
    let (bytes, _) = file_of("roundtrip", 20);
    let c = parse(&bytes).unwrap();
    assert_eq!(
        c.header,
        Header {
            format: FORMAT,
            node_id: "node-a".into(),
            begun_at: 42
        }
    );
    assert_eq!(c.records, (0..20).map(record).collect::<Vec<_>>());
    assert_eq!((c.damaged, c.cut_tail), (0, 0));
}

#[test]
fn files_are_the_owners_alone_and_never_overwritten() {
    use std::os::unix::fs::PermissionsExt;
    let d = dir("mode");
    let path = d.join("state.log");
    Writer::create(&path, "n", 0, u64::MAX).unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    assert!(matches!(
        Writer::create(&path, "n", 0, u64::MAX),
        Err(LogError::Io(e)) if e.kind() == io::ErrorKind::AlreadyExists
    ));
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn a_flipped_byte_costs_its_record_alone() {
    let (mut bytes, starts) = file_of("flip", 10);
    // In record 4's payload, then in record 7's length.
    bytes[starts[4] + FRAME + 2] ^= 0x40;
    bytes[starts[7] + 5] ^= 0x01;
    let c = parse(&bytes).unwrap();
    let want: Vec<_> = (0..10).filter(|i| *i != 4 && *i != 7).map(record).collect();
    assert_eq!(c.records, want);
    assert_eq!(c.damaged, 2);
}

#[test]
fn a_cut_tail_is_ignored_at_every_cut() {
    let (bytes, starts) = file_of("cut", 5);
    for cut in starts[4] + 1..bytes.len() {
        let c = parse(&bytes[..cut]).unwrap();
        assert_eq!(
            c.records,
            (0..4).map(record).collect::<Vec<_>>(),
            "cut at {cut}"
        );
        assert_eq!(
            (c.damaged, c.cut_tail),
            (0, cut - starts[4]),
            "cut at {cut}"
        );
    }
}

#[test]
fn an_empty_or_foreign_file_is_not_a_state_file() {
    assert!(matches!(parse(b""), Err(LogError::NotAStateFile)));
    assert!(matches!(
        parse(b"[policies.api]\nlimit = 1\n"),
        Err(LogError::NotAStateFile)
    ));
}

/// Where format 1's header ends (its checksum after it) for node "node-a".
const HEAD: usize = HEADER_FIXED + "node-a".len();

#[test]
fn a_damaged_header_is_refused_as_damaged() {
    let (bytes, _) = file_of("header", 3);
    for at in 8..HEAD + 8 {
        for mask in [0x01, 0x04, 0x80] {
            let mut b = bytes.clone();
            b[at] ^= mask;
            let e = parse(&b).unwrap_err();
            assert!(matches!(e, LogError::DamagedHeader), "byte {at}: {e}");
        }
    }
    assert!(matches!(
        parse(&bytes[..HEAD]),
        Err(LogError::DamagedHeader)
    ));
}

#[test]
fn a_newer_format_is_refused_with_its_number_whatever_its_header_holds() {
    // A format 2 whose header holds a field format 1 never had.
    let mut head = MAGIC.to_vec();
    head.extend_from_slice(&(FORMAT + 1).to_le_bytes());
    let fields = b"a longer header of another layout";
    head.extend_from_slice(&((16 + fields.len()) as u32).to_le_bytes());
    head.extend_from_slice(fields);
    let sum = xxh3_64_with_seed(&head, 0);
    head.extend_from_slice(&sum.to_le_bytes());
    head.extend_from_slice(b"records of its own");
    let e = parse(&head).unwrap_err();
    assert!(
        matches!(e, LogError::NewerFormat { found } if found == FORMAT + 1),
        "{e}"
    );
    assert!(e.to_string().contains("newer than this build's 1"), "{e}");
}

#[test]
fn a_tail_of_zeros_is_a_cut_tail() {
    let (mut bytes, _) = file_of("zeros", 4);
    bytes.extend_from_slice(&[0u8; 4096]);
    let c = parse(&bytes).unwrap();
    assert_eq!(c.records, (0..4).map(record).collect::<Vec<_>>());
    assert_eq!((c.damaged, c.cut_tail), (0, 4096));
}

#[test]
fn a_record_smuggled_in_a_key_does_not_pass_after_a_resync() {
    // A client's key holding a whole frame: a guess at the seed (0) and a
    // payload of its choosing.
    let fake = b"reset everything";
    let len = (fake.len() as u32).to_le_bytes();
    let mut smuggled = b"key:".to_vec();
    smuggled.extend_from_slice(SYNC);
    smuggled.extend_from_slice(&len);
    smuggled.extend_from_slice(&checksum(0, &len, fake).to_le_bytes());
    smuggled.extend_from_slice(fake);
    let d = dir("smuggle");
    let path = d.join("state.log");
    let mut w = Writer::create(&path, "n", 0, u64::MAX).unwrap();
    w.append(b"before").unwrap();
    let at = w.written() as usize;
    w.append(&smuggled).unwrap();
    w.append(b"after").unwrap();
    w.sync().unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    // The record that carries it is damaged: reading resyncs inside it.
    bytes[at + 9] ^= 0xff;
    let c = parse(&bytes).unwrap();
    assert_eq!(c.records, vec![b"before".to_vec(), b"after".to_vec()]);
    assert_eq!(c.damaged, 1);
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn the_bound_refuses_an_append_whole() {
    let d = dir("bound");
    let path = d.join("state.log");
    let mut w = Writer::create(&path, "n", 0, 100).unwrap();
    let head = w.written();
    let payload = vec![7u8; (100 - head) as usize - FRAME];
    w.append(&payload).unwrap();
    assert_eq!(w.written(), 100);
    assert!(matches!(w.append(b""), Err(LogError::Full { bound: 100 })));
    assert_eq!(w.written(), 100);
    assert!(matches!(
        w.append(&vec![0; MAX_RECORD + 1]),
        Err(LogError::RecordTooLarge(_))
    ));
    w.sync().unwrap();
    let c = read(&path, u64::MAX).unwrap();
    assert_eq!(c.records, vec![payload]);
    // Read to a bound: what follows the header is a cut tail.
    let c = read(&path, 60).unwrap();
    assert!(c.records.is_empty());
    assert_eq!(c.cut_tail as u64, 100 - head);
    // A header past the bound is refused.
    assert!(matches!(
        Writer::create(&d.join("small.log"), "n", 0, 10),
        Err(LogError::Full { bound: 10 })
    ));
    std::fs::remove_dir_all(&d).ok();
}

proptest! {
    /// Whatever bytes are flipped, every record read back is one that was
    /// written, in order, none twice; and the records no flip touched are
    /// all read back.
    #[test]
    fn damage_never_invents_or_reorders_a_record(
        n in 1usize..30,
        flips in proptest::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..4),
    ) {
        let (mut bytes, starts) = file_of("prop", n);
        let body = starts[0];
        let mut touched = std::collections::BTreeSet::new();
        for (i, mask) in &flips {
            let at = body + i.index(bytes.len() - body);
            bytes[at] ^= mask;
            touched.insert(starts.iter().rposition(|s| *s <= at).unwrap());
        }
        let c = parse(&bytes).unwrap();
        let mut next = 0;
        for r in &c.records {
            let i = (next..n).find(|i| record(*i) == *r);
            prop_assert!(i.is_some(), "a record never written, or out of order: {:?}", r);
            next = i.unwrap() + 1;
        }
        for i in (0..n).filter(|i| !touched.contains(i)) {
            prop_assert!(c.records.contains(&record(i)), "untouched record {} lost", i);
        }
    }
}
