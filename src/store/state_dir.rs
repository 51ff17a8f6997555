//! The state directory (`state.dir`, issue 43): the files of
//! [`super::state_log`] a node keeps its entries in, what each record
//! means, and how the files are replaced.
//!
//! Records are changes: a key's value put (the whole entry, opaque here),
//! a key removed, and a *dump's end*. A file is begun either as a dump —
//! every live key put, then the dump's end — or, after one, as more
//! changes. Loading reads every file in order, each change superseding
//! the last of its key, from the newest file whose dump ended: what is
//! older than a whole dump is not read, so a key removed before the dump
//! does not come back from an older file. A dump cut short by a crash
//! counts for nothing but its puts (each a key's value when it was
//! written, newer than any older file's); the older files stay until a
//! dump ends, are then removed, and the directory synced.
//!
//! Bounded: the files together hold at most `bound` bytes, but while a
//! dump is written (it may take `bound` itself, and the files it replaces
//! go once it ends: at most twice `bound`, for that while). An append that
//! would pass it is refused ([`LogError::Full`]): the caller dumps (which
//! frees what older files held), or runs without, loudly. Loading keeps
//! at most `max_keys` keys (the store's cap), the first read; the rest are
//! counted, not kept. A directory that cannot be written is not used at
//! all: [`StateDir::open`] fails and the node runs without it.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};

use super::state_log::{self, LogError, Writer};

const PUT: u8 = 1;
const REMOVE: u8 = 2;
const DUMP_END: u8 = 3;

/// One change of a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change<'a> {
    Put { key: &'a [u8], value: &'a [u8] },
    Remove { key: &'a [u8] },
}

/// What reading one file found.
#[derive(Debug)]
pub struct FileReport {
    pub path: PathBuf,
    /// Records read whole.
    pub records: usize,
    /// Damaged stretches skipped, and bytes of a cut tail.
    pub damaged: usize,
    pub cut_tail: usize,
    /// Why the file was not read at all (a newer format, not a state file,
    /// a damaged header, an I/O error).
    pub refused: Option<String>,
    /// Records that were no change this format knows (read, not applied).
    pub unknown: usize,
}

/// What a directory held at start.
#[derive(Debug, Default)]
pub struct Loaded {
    /// Each key's last value.
    pub entries: HashMap<Vec<u8>, Vec<u8>>,
    /// Puts of keys past `max_keys`, not kept.
    pub dropped: usize,
    pub files: Vec<FileReport>,
    /// A file of a newer format was found (its number).
    pub newer: Option<u32>,
}

/// The directory, and the file being appended to.
pub struct StateDir {
    dir: PathBuf,
    node_id: String,
    bound: u64,
    /// The next file's number.
    next: u64,
    /// The files in use, oldest first, with their sizes.
    files: Vec<(u64, u64)>,
    writer: Option<(u64, Writer)>,
}

impl StateDir {
    /// Open `dir` (created, mode 0700, if missing) and load what it holds.
    /// Fails if the directory cannot be made, read or written: the caller
    /// then runs without it.
    pub fn open(
        dir: &Path,
        node_id: &str,
        bound: u64,
        max_keys: usize,
    ) -> Result<(StateDir, Loaded), LogError> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        // Writable now, or not used at all (not read either): found at
        // start, not at the first interval.
        let probe = dir.join(".probe");
        std::fs::write(&probe, b"")?;
        std::fs::remove_file(&probe)?;
        let mut numbers = Vec::new();
        for e in std::fs::read_dir(dir)? {
            let name = e?.file_name();
            if let Some(n) = name.to_str().and_then(number_of) {
                numbers.push(n);
            }
        }
        numbers.sort_unstable();
        let mut files = Vec::new();
        for n in &numbers {
            let size = std::fs::metadata(path_of(dir, *n)).map_or(0, |m| m.len());
            files.push((*n, size));
        }
        let loaded = load(dir, &numbers, bound, max_keys);
        // A newer Sluice's files are neither read in part (their removals
        // would be lost) nor replaced by this build's next dump.
        if let Some(newer) = loaded.newer {
            return Err(LogError::NewerFormat { found: newer });
        }
        let next = match numbers.last() {
            Some(n) => n.checked_add(1).ok_or(LogError::NotAStateFile)?,
            None => 0,
        };
        let state = StateDir {
            dir: dir.to_path_buf(),
            node_id: node_id.to_string(),
            bound,
            next,
            files,
            writer: None,
        };
        Ok((state, loaded))
    }

    /// Bytes the files hold together.
    pub fn bytes(&self) -> u64 {
        let writing = self.writer.as_ref().map_or(0, |(_, w)| w.written());
        let closed: u64 = self
            .files
            .iter()
            .filter(|(n, _)| self.writer.as_ref().is_none_or(|(w, _)| w != n))
            .map(|(_, s)| s)
            .sum();
        closed + writing
    }

    /// Append a change to the current file (begun if there is none).
    /// Durable once [`StateDir::sync`] returns (nothing syncs on drop: a
    /// caller that stops syncs first, and sees the error).
    pub fn append(&mut self, change: Change<'_>, now: u64) -> Result<(), LogError> {
        if self.writer.is_none() {
            let room = self.bound.saturating_sub(self.bytes());
            self.begin(now, room)?;
        }
        let record = encode(change);
        let room = self.bound.saturating_sub(self.bytes() - self.writing());
        let (_, w) = self.writer.as_mut().expect("begun above");
        w.set_bound(room);
        w.append(&record)
    }

    /// Put every change appended so far on disk.
    pub fn sync(&mut self) -> Result<(), LogError> {
        match self.writer.as_mut() {
            Some((_, w)) => w.sync(),
            None => Ok(()),
        }
    }

    /// Write every live key to a new file; once it is whole and on disk,
    /// remove the older files. Later changes go to the new file. A dump
    /// that fails removes its own file (the older ones stay in use).
    pub fn dump<'a>(
        &mut self,
        live: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
        now: u64,
    ) -> Result<(), LogError> {
        // A file whose last writes failed is left as it is: the dump
        // replaces it.
        self.close();
        // The dump may use the whole bound: older files go once it ends.
        self.begin(now, self.bound)?;
        let (n, w) = self.writer.as_mut().expect("begun above");
        let n = *n;
        let written = (|| {
            for (key, value) in live {
                w.append(&encode(Change::Put { key, value }))?;
            }
            w.append(&[DUMP_END])?;
            w.sync()?;
            sync_dir(&self.dir).map_err(LogError::from)
        })();
        if let Err(e) = written {
            self.writer = None;
            let _ = std::fs::remove_file(path_of(&self.dir, n));
            self.files.retain(|(f, _)| *f != n);
            return Err(e);
        }
        let older: Vec<u64> = self
            .files
            .iter()
            .map(|(f, _)| *f)
            .filter(|f| *f < n)
            .collect();
        for f in older {
            match std::fs::remove_file(path_of(&self.dir, f)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e.into()),
            }
            self.files.retain(|(g, _)| *g != f);
        }
        sync_dir(&self.dir)?;
        Ok(())
    }

    /// Sync the file being appended to (best effort) and stop appending
    /// to it; its size is what is on disk.
    fn close(&mut self) {
        if let Some((n, mut w)) = self.writer.take() {
            let _ = w.sync();
            drop(w);
            let size = std::fs::metadata(path_of(&self.dir, n)).map_or(0, |m| m.len());
            if let Some(f) = self.files.iter_mut().find(|(f, _)| *f == n) {
                f.1 = size;
            }
        }
    }

    fn writing(&self) -> u64 {
        self.writer.as_ref().map_or(0, |(_, w)| w.written())
    }

    fn begin(&mut self, now: u64, room: u64) -> Result<(), LogError> {
        let n = self.next;
        // Taken whether or not the file is made: a name half made (or
        // taken by another process) is never tried again.
        self.next = n.checked_add(1).ok_or(LogError::NotAStateFile)?;
        let path = path_of(&self.dir, n);
        let w = Writer::create(&path, &self.node_id, now, room);
        let w = match w {
            Ok(w) => w,
            Err(e) => {
                if !matches!(&e, LogError::Io(io) if io.kind() == io::ErrorKind::AlreadyExists) {
                    let _ = std::fs::remove_file(&path);
                }
                return Err(e);
            }
        };
        self.files.push((n, 0));
        self.writer = Some((n, w));
        Ok(())
    }
}

fn encode(change: Change<'_>) -> Vec<u8> {
    match change {
        Change::Put { key, value } => {
            let mut r = Vec::with_capacity(5 + key.len() + value.len());
            r.push(PUT);
            r.extend_from_slice(&(key.len() as u32).to_le_bytes());
            r.extend_from_slice(key);
            r.extend_from_slice(value);
            r
        }
        Change::Remove { key } => {
            let mut r = Vec::with_capacity(1 + key.len());
            r.push(REMOVE);
            r.extend_from_slice(key);
            r
        }
    }
}

/// A record as a change, or the dump's end (None), or Err if no change
/// this format knows.
fn decode(record: &[u8]) -> Result<Option<Change<'_>>, ()> {
    match record.split_first() {
        Some((&PUT, rest)) if rest.len() >= 4 => {
            let n = u32::from_le_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
            let rest = &rest[4..];
            if n > rest.len() {
                return Err(());
            }
            Ok(Some(Change::Put {
                key: &rest[..n],
                value: &rest[n..],
            }))
        }
        Some((&REMOVE, key)) => Ok(Some(Change::Remove { key })),
        Some((&DUMP_END, [])) => Ok(None),
        _ => Err(()),
    }
}

fn load(dir: &Path, numbers: &[u64], bound: u64, max_keys: usize) -> Loaded {
    let mut loaded = Loaded::default();
    // Newest first, back to the newest file whose dump ended: older files
    // are not read (nor held in memory).
    let mut read = Vec::new();
    for n in numbers.iter().rev() {
        let path = path_of(dir, *n);
        let mut report = FileReport {
            path: path.clone(),
            records: 0,
            damaged: 0,
            cut_tail: 0,
            refused: None,
            unknown: 0,
        };
        let mut records = Vec::new();
        match state_log::read(&path, bound) {
            Ok(c) => {
                report.records = c.records.len();
                report.damaged = c.damaged;
                report.cut_tail = c.cut_tail;
                records = c.records;
            }
            Err(e) => {
                if let LogError::NewerFormat { found } = e {
                    loaded.newer = loaded.newer.max(Some(found));
                }
                report.refused = Some(e.to_string());
            }
        }
        let base = records.iter().any(|r| decode(r) == Ok(None));
        read.push((report, records));
        if base {
            break;
        }
    }
    for (mut report, records) in read.into_iter().rev() {
        // In the base file, what precedes its dump's end is the dump.
        for r in &records {
            match decode(r) {
                Ok(Some(Change::Put { key, value })) => {
                    if loaded.entries.len() >= max_keys && !loaded.entries.contains_key(key) {
                        loaded.dropped += 1;
                        continue;
                    }
                    loaded.entries.insert(key.to_vec(), value.to_vec());
                }
                Ok(Some(Change::Remove { key })) => {
                    loaded.entries.remove(key);
                }
                Ok(None) => {}
                Err(()) => report.unknown += 1,
            }
        }
        loaded.files.push(report);
    }
    loaded
}

/// A file's number, from its name as [`path_of`] writes it (20 digits):
/// no other name is taken for one of ours.
fn number_of(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("state-")?.strip_suffix(".log")?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

fn path_of(dir: &Path, n: u64) -> PathBuf {
    dir.join(format!("state-{n:020}.log"))
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
#[path = "state_dir_tests.rs"]
mod tests;
