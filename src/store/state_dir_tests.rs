use super::*;

fn fresh(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sluice-state-dir-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn put<'a>(key: &'a str, value: &'a str) -> Change<'a> {
    Change::Put {
        key: key.as_bytes(),
        value: value.as_bytes(),
    }
}

fn entries(loaded: &Loaded) -> Vec<(String, String)> {
    let mut e: Vec<_> = loaded
        .entries
        .iter()
        .map(|(k, v)| {
            (
                String::from_utf8(k.clone()).unwrap(),
                String::from_utf8(v.clone()).unwrap(),
            )
        })
        .collect();
    e.sort();
    e
}

fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
    p.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn files(dir: &Path) -> Vec<String> {
    let mut f: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    f.sort();
    f
}

#[test]
fn each_key_loads_as_its_last_change() {
    let d = fresh("last");
    let (mut s, loaded) = StateDir::open(&d, "n1", 1 << 20, 100).unwrap();
    assert!(loaded.entries.is_empty() && loaded.files.is_empty());
    s.append(put("a", "1"), 0).unwrap();
    s.append(put("b", "1"), 0).unwrap();
    s.append(put("a", "2"), 0).unwrap();
    s.append(Change::Remove { key: b"b" }, 0).unwrap();
    s.append(put("c", ""), 0).unwrap();
    s.sync().unwrap();
    drop(s);
    let (_, loaded) = StateDir::open(&d, "n1", 1 << 20, 100).unwrap();
    assert_eq!(entries(&loaded), pairs(&[("a", "2"), ("c", "")]));
    assert_eq!(loaded.files.len(), 1);
    assert_eq!(loaded.files[0].records, 5);
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn only_the_owner_reads_the_directory_and_its_files() {
    use std::os::unix::fs::PermissionsExt;
    let d = fresh("mode");
    let (mut s, _) = StateDir::open(&d, "n1", 1 << 20, 100).unwrap();
    s.append(put("a", "1"), 0).unwrap();
    s.sync().unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&d), 0o700);
    assert_eq!(mode(&d.join(&files(&d)[0])), 0o600);
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn a_dump_replaces_the_older_files_and_later_changes_follow_it() {
    let d = fresh("dump");
    let (mut s, _) = StateDir::open(&d, "n1", 1 << 20, 100).unwrap();
    for i in 0..50 {
        s.append(put("hot", &i.to_string()), 0).unwrap();
    }
    s.append(put("gone", "x"), 0).unwrap();
    let before = s.bytes();
    s.dump([(b"hot".as_slice(), b"49".as_slice())], 1).unwrap();
    assert!(s.bytes() < before / 4, "{} of {before}", s.bytes());
    s.append(put("new", "1"), 2).unwrap();
    s.sync().unwrap();
    assert_eq!(files(&d), vec!["state-00000000000000000001.log"]);
    drop(s);
    let (_, loaded) = StateDir::open(&d, "n1", 1 << 20, 100).unwrap();
    assert_eq!(entries(&loaded), pairs(&[("hot", "49"), ("new", "1")]));
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn a_key_removed_before_a_dump_stays_removed_if_older_files_outlive_it() {
    // A crash between the dump's end and the older files' removal.
    let d = fresh("outlive");
    let (mut s, _) = StateDir::open(&d, "n1", 1 << 20, 100).unwrap();
    s.append(put("gone", "x"), 0).unwrap();
    s.append(put("kept", "1"), 0).unwrap();
    s.sync().unwrap();
    let old = d.join(&files(&d)[0]);
    let kept_aside = std::fs::read(&old).unwrap();
    s.dump([(b"kept".as_slice(), b"1".as_slice())], 1).unwrap();
    drop(s);
    std::fs::write(&old, kept_aside).unwrap();
    assert_eq!(files(&d).len(), 2);
    let (_, loaded) = StateDir::open(&d, "n1", 1 << 20, 100).unwrap();
    assert_eq!(entries(&loaded), pairs(&[("kept", "1")]));
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn a_dump_cut_short_adds_its_puts_to_the_older_files() {
    let d = fresh("cutdump");
    let (mut s, _) = StateDir::open(&d, "n1", 1 << 20, 100).unwrap();
    s.append(put("a", "1"), 0).unwrap();
    s.append(put("b", "1"), 0).unwrap();
    s.sync().unwrap();
    let old = d.join(&files(&d)[0]);
    let kept_aside = std::fs::read(&old).unwrap();
    s.dump(
        [
            (b"a".as_slice(), b"2".as_slice()),
            (b"b".as_slice(), b"2".as_slice()),
        ],
        1,
    )
    .unwrap();
    drop(s);
    std::fs::write(&old, kept_aside).unwrap();
    // The crash came after the first put: the dump's end and "b" lost.
    let dump = d.join(&files(&d)[1]);
    let bytes = std::fs::read(&dump).unwrap();
    let whole = state_log::parse(&bytes).unwrap();
    let first_put = 16 + whole.records[0].len();
    let header = bytes.len() - whole.records.iter().map(|r| 16 + r.len()).sum::<usize>();
    std::fs::write(&dump, &bytes[..header + first_put + 3]).unwrap();
    let (_, loaded) = StateDir::open(&d, "n1", 1 << 20, 100).unwrap();
    assert_eq!(entries(&loaded), pairs(&[("a", "2"), ("b", "1")]));
    assert_eq!(loaded.files[1].cut_tail, 3);
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn the_bound_refuses_appends_until_a_dump_frees_room() {
    let d = fresh("bound");
    let (mut s, _) = StateDir::open(&d, "n1", 400, 100).unwrap();
    let mut appended = 0;
    let refused = loop {
        match s.append(put("k", &"v".repeat(20)), 0) {
            Ok(()) => appended += 1,
            Err(e) => break e,
        }
        assert!(appended < 100, "never refused");
    };
    assert!(
        matches!(refused, LogError::Full { bound } if bound <= 400),
        "{refused}"
    );
    assert!(s.bytes() <= 400, "{}", s.bytes());
    s.dump([(b"k".as_slice(), b"v".as_slice())], 1).unwrap();
    s.append(put("k", "w"), 2).unwrap();
    s.sync().unwrap();
    assert!(s.bytes() <= 400, "{}", s.bytes());
    let (_, loaded) = StateDir::open(&d, "n1", 400, 100).unwrap();
    assert_eq!(entries(&loaded), pairs(&[("k", "w")]));
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn a_directory_that_cannot_be_written_is_not_used() {
    // Root ignores permission bits; /proc refuses every new name.
    let e = StateDir::open(Path::new("/proc/sluice-state"), "n1", 1 << 20, 100)
        .err()
        .expect("refused");
    assert!(matches!(e, LogError::Io(_)), "{e}");
}

#[test]
fn loading_keeps_at_most_max_keys() {
    let d = fresh("cap");
    let (mut s, _) = StateDir::open(&d, "n1", 1 << 20, 100).unwrap();
    for k in ["a", "b", "c", "d"] {
        s.append(put(k, "1"), 0).unwrap();
    }
    s.append(put("a", "2"), 0).unwrap();
    s.sync().unwrap();
    drop(s);
    let (_, loaded) = StateDir::open(&d, "n1", 1 << 20, 2).unwrap();
    assert_eq!(entries(&loaded), pairs(&[("a", "2"), ("b", "1")]));
    assert_eq!(loaded.dropped, 2);
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn damage_costs_its_own_records_alone() {
    let d = fresh("damage");
    let (mut s, _) = StateDir::open(&d, "n1", 1 << 20, 100).unwrap();
    s.append(put("a", "1"), 0).unwrap();
    s.append(put("b", "1"), 0).unwrap();
    s.append(put("c", "1"), 0).unwrap();
    s.sync().unwrap();
    drop(s);
    let file = d.join(&files(&d)[0]);
    let mut bytes = std::fs::read(&file).unwrap();
    // The last byte of the second record ("b"'s value).
    let records = state_log::parse(&bytes).unwrap().records;
    let header = bytes.len() - records.iter().map(|r| 16 + r.len()).sum::<usize>();
    let at = header + (16 + records[0].len()) + 16 + records[1].len() - 1;
    assert_eq!(bytes[at], b'1');
    bytes[at] ^= 0x01;
    std::fs::write(&file, &bytes).unwrap();
    let (_, loaded) = StateDir::open(&d, "n1", 1 << 20, 100).unwrap();
    assert_eq!(entries(&loaded), pairs(&[("a", "1"), ("c", "1")]));
    assert_eq!(loaded.files[0].damaged, 1);
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn a_directory_with_a_newer_format_is_not_used_and_left_as_it_is() {
    let d = fresh("newer");
    let (mut s, _) = StateDir::open(&d, "n1", 1 << 20, 100).unwrap();
    s.append(put("a", "1"), 0).unwrap();
    s.sync().unwrap();
    drop(s);
    let mut newer = b"SLUICEST".to_vec();
    newer.extend_from_slice(&(state_log::FORMAT + 1).to_le_bytes());
    newer.extend_from_slice(&16u32.to_le_bytes());
    let sum = xxhash_rust::xxh3::xxh3_64_with_seed(&newer, 0);
    newer.extend_from_slice(&sum.to_le_bytes());
    std::fs::write(d.join("state-00000000000000000007.log"), &newer).unwrap();
    let before = files(&d);
    let e = StateDir::open(&d, "n1", 1 << 20, 100)
        .err()
        .expect("refused");
    assert!(e.to_string().contains("newer than this build's"), "{e}");
    assert_eq!(files(&d), before);
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn a_dump_that_fails_removes_its_own_file_and_the_older_ones_stay_in_use() {
    let d = fresh("faileddump");
    let (mut s, _) = StateDir::open(&d, "n1", 300, 100).unwrap();
    s.append(put("a", "1"), 0).unwrap();
    s.sync().unwrap();
    let before = files(&d);
    let big = vec![7u8; 200];
    let live = [
        (b"x".as_slice(), big.as_slice()),
        (b"y".as_slice(), big.as_slice()),
    ];
    assert!(matches!(s.dump(live, 1), Err(LogError::Full { .. })));
    assert_eq!(files(&d), before);
    s.append(put("b", "1"), 2).unwrap();
    s.sync().unwrap();
    let (_, loaded) = StateDir::open(&d, "n1", 300, 100).unwrap();
    assert_eq!(entries(&loaded), pairs(&[("a", "1"), ("b", "1")]));
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn names_not_written_as_ours_are_left_alone() {
    let d = fresh("names");
    std::fs::create_dir_all(&d).unwrap();
    for name in [
        "state-5.log",
        "state-+0000000000000000005.log",
        "state-x.log",
        "notes.txt",
    ] {
        std::fs::write(d.join(name), b"not ours").unwrap();
    }
    let (mut s, loaded) = StateDir::open(&d, "n1", 1 << 20, 100).unwrap();
    assert!(loaded.files.is_empty());
    s.append(put("a", "1"), 0).unwrap();
    s.dump([(b"a".as_slice(), b"1".as_slice())], 1).unwrap();
    let left: Vec<_> = files(&d)
        .into_iter()
        .filter(|f| !f.starts_with("state-000"))
        .collect();
    assert_eq!(left.len(), 4, "{left:?}");
    std::fs::remove_dir_all(&d).ok();
}
