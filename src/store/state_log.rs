//! The file format of the state directory (`state.dir`, issue 43): the
//! log a node writes the entries it holds to, so counts outlive a restart
//! of the whole fleet. This is the format alone — framing, checksums, the
//! version, reading past damage — over opaque records; what a record says
//! (an entry, a reset) and when files are written and compacted are the
//! writer's.
//!
//! Why a log of our own rather than an embedded store: what a node writes
//! is a stream of whole-entry records, each superseding the last of its
//! key, read back once at start. An append-only file with a checksum per
//! record says that in ~200 lines and no dependency; an embedded store
//! (sled, redb, RocksDB) brings its own write amplification, locking and
//! recovery for random reads Sluice never makes.
//!
//! A file: a header, then records. Every format's header begins `MAGIC |
//! format u32 | length u32` and ends, `length` bytes in, with its xxh3
//! (seed 0): so a newer format is told apart from damage whatever else its
//! header holds. Format 1's holds a random checksum seed, when the file was
//! begun and the writing node's id. Each record is
//! `SYNC | len u32 | checksum u64 | payload`, the checksum an xxh3 of the
//! length and payload with the file's seed. Reading:
//! - a record whose checksum fails is skipped, and reading resumes at the
//!   next `SYNC` that begins a record whose checksum holds: damage costs
//!   the records it touched, never the file;
//! - the seed is random per file, so a record smuggled inside a client's
//!   key (keys are client data) cannot pass for one after a resync;
//! - a tail cut short (a crash mid-append), or filled with zeros (what some
//!   file systems leave after a crash), is reported and ignored;
//! - a file of a newer format is refused with its number, never guessed at.
//!
//! Files are created mode 0600 (keys are client data). A writer holds a
//! byte bound: an append that would pass it is refused, and the caller
//! runs without (loudly) or compacts.

use std::fs::File;
use std::io::{self, Read as _, Write};
use std::path::Path;

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// This build writes format 1 and reads formats up to it.
pub const FORMAT: u32 = 1;

const MAGIC: &[u8; 8] = b"SLUICEST";
const SYNC: &[u8; 4] = b"\xF0SR\x0F";
/// `SYNC`, the length and the checksum.
const FRAME: usize = 4 + 4 + 8;
/// No record is longer (a key is at most a few KiB; an entry less).
pub const MAX_RECORD: usize = 1 << 20;
/// Format 1's header before the node id: magic, format, length, seed,
/// begun at, the id's length.
const HEADER_FIXED: usize = 8 + 4 + 4 + 8 + 8 + 4;
/// No header of any format is longer.
const MAX_HEADER: usize = 1 << 16;

/// What a file says about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub format: u32,
    /// The node that wrote it.
    pub node_id: String,
    /// When the file was begun: epoch nanoseconds by the writer's clock.
    pub begun_at: u64,
}

/// Why a file was not read.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("not a Sluice state file (no header)")]
    NotAStateFile,
    #[error("its header is damaged (checksum)")]
    DamagedHeader,
    #[error(
        "written in state format {found}, newer than this build's {FORMAT}: \
         start a newer Sluice, or move the file away to start without it"
    )]
    NewerFormat { found: u32 },
    #[error("the state file is full ({bound} bytes, its bound)")]
    Full { bound: u64 },
    #[error("a record of {0} bytes is larger than {MAX_RECORD}")]
    RecordTooLarge(usize),
}

/// Appends records to one file.
pub struct Writer {
    file: io::BufWriter<File>,
    seed: u64,
    written: u64,
    bound: u64,
    /// A write failed: what is on disk is unknown past `written`, so
    /// nothing more is appended (the caller begins a new file).
    failed: bool,
}

impl Writer {
    /// Begin the file at `path` (it must not exist: a file is written once,
    /// then replaced whole), mode 0600, holding at most `bound` bytes.
    pub fn create(
        path: &Path,
        node_id: &str,
        begun_at: u64,
        bound: u64,
    ) -> Result<Writer, LogError> {
        use std::os::unix::fs::OpenOptionsExt;
        let mut seed = [0u8; 8];
        getrandom::getrandom(&mut seed).map_err(|e| io::Error::other(e.to_string()))?;
        let seed = u64::from_le_bytes(seed);
        let length = u32::try_from(HEADER_FIXED + node_id.len())
            .ok()
            .filter(|l| *l as usize <= MAX_HEADER)
            .ok_or(LogError::RecordTooLarge(node_id.len()))?;
        let mut head = Vec::with_capacity(length as usize + 8);
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&FORMAT.to_le_bytes());
        head.extend_from_slice(&length.to_le_bytes());
        head.extend_from_slice(&seed.to_le_bytes());
        head.extend_from_slice(&begun_at.to_le_bytes());
        head.extend_from_slice(&(node_id.len() as u32).to_le_bytes());
        head.extend_from_slice(node_id.as_bytes());
        // The header's checksum has seed 0: the seed is in what it covers.
        let sum = xxh3_64_with_seed(&head, 0);
        head.extend_from_slice(&sum.to_le_bytes());
        if head.len() as u64 > bound {
            return Err(LogError::Full { bound });
        }
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)?;
        let mut w = Writer {
            file: io::BufWriter::new(file),
            seed,
            written: 0,
            bound,
            failed: false,
        };
        w.put(&head)?;
        Ok(w)
    }

    /// Append one record, whole or not at all as far as the bound goes
    /// (a crash mid-append leaves a cut tail, which reading ignores).
    pub fn append(&mut self, payload: &[u8]) -> Result<(), LogError> {
        if payload.len() > MAX_RECORD {
            return Err(LogError::RecordTooLarge(payload.len()));
        }
        let len = (payload.len() as u32).to_le_bytes();
        let sum = checksum(self.seed, &len, payload);
        let mut frame = [0u8; FRAME];
        frame[..4].copy_from_slice(SYNC);
        frame[4..8].copy_from_slice(&len);
        frame[8..].copy_from_slice(&sum.to_le_bytes());
        if self.written + (FRAME + payload.len()) as u64 > self.bound {
            return Err(LogError::Full { bound: self.bound });
        }
        self.put(&frame)?;
        self.put(payload)
    }

    /// Hold the file to `bound` bytes from now (appends already made
    /// stay).
    pub fn set_bound(&mut self, bound: u64) {
        self.bound = bound;
    }

    /// Bytes written so far, the header included.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Everything appended is on disk when this returns.
    pub fn sync(&mut self) -> Result<(), LogError> {
        self.usable()?;
        let done = self
            .file
            .flush()
            .and_then(|()| self.file.get_ref().sync_data());
        self.failed |= done.is_err();
        Ok(done?)
    }

    fn put(&mut self, bytes: &[u8]) -> Result<(), LogError> {
        self.usable()?;
        let done = self.file.write_all(bytes);
        self.failed |= done.is_err();
        done?;
        self.written += bytes.len() as u64;
        Ok(())
    }

    fn usable(&self) -> Result<(), LogError> {
        if self.failed {
            return Err(LogError::Io(io::Error::other(
                "an earlier write to this state file failed",
            )));
        }
        Ok(())
    }
}

fn checksum(seed: u64, len: &[u8; 4], payload: &[u8]) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::with_seed(seed);
    h.update(len);
    h.update(payload);
    h.digest()
}

/// A file read back.
#[derive(Debug)]
pub struct Contents {
    pub header: Header,
    /// The records that passed their checksums, in file order.
    pub records: Vec<Vec<u8>>,
    /// Stretches of the file skipped as damaged (each may have held
    /// several records).
    pub damaged: usize,
    /// Bytes at the end that make no whole record (a cut append).
    pub cut_tail: usize,
}

/// Read the file at `path`, at most `bound` bytes of it (a larger file is
/// read to the bound, the rest counted as its cut tail).
pub fn read(path: &Path, bound: u64) -> Result<Contents, LogError> {
    let mut bytes = Vec::new();
    File::open(path)?.take(bound).read_to_end(&mut bytes)?;
    let total = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let beyond = usize::try_from(total.saturating_sub(bytes.len() as u64)).unwrap_or(usize::MAX);
    let mut c = parse(&bytes)?;
    c.cut_tail = c.cut_tail.saturating_add(beyond);
    Ok(c)
}

/// [`read`] over bytes in memory.
pub fn parse(bytes: &[u8]) -> Result<Contents, LogError> {
    let (header, seed, mut at) = parse_header(bytes)?;
    let mut c = Contents {
        header,
        records: Vec::new(),
        damaged: 0,
        cut_tail: 0,
    };
    let mut in_damage = false;
    while at < bytes.len() {
        if !in_damage && bytes[at..].iter().all(|b| *b == 0) {
            c.cut_tail = bytes.len() - at;
            break;
        }
        match record_at(bytes, at, seed) {
            Found::Record(end) => {
                c.records.push(bytes[at + FRAME..end].to_vec());
                at = end;
                in_damage = false;
            }
            Found::Cut if !in_damage => {
                // Nothing whole after it: a cut tail, unless a record
                // follows (then this was damage, resumed from below).
                match next_record(bytes, at + 1, seed) {
                    Some(next) => {
                        c.damaged += 1;
                        at = next;
                    }
                    None => {
                        c.cut_tail = bytes.len() - at;
                        break;
                    }
                }
            }
            Found::Cut | Found::Damaged => {
                if !in_damage {
                    c.damaged += 1;
                    in_damage = true;
                }
                match next_record(bytes, at + 1, seed) {
                    Some(next) => at = next,
                    None => break,
                }
            }
        }
    }
    Ok(c)
}

enum Found {
    /// A whole record ending at this offset.
    Record(usize),
    /// Too few bytes left for the record its frame announces.
    Cut,
    /// No record here.
    Damaged,
}

fn record_at(bytes: &[u8], at: usize, seed: u64) -> Found {
    let rest = &bytes[at..];
    if rest.len() < FRAME {
        return if SYNC.starts_with(&rest[..rest.len().min(4)]) {
            Found::Cut
        } else {
            Found::Damaged
        };
    }
    if &rest[..4] != SYNC {
        return Found::Damaged;
    }
    let len: [u8; 4] = rest[4..8].try_into().expect("4 bytes");
    let n = u32::from_le_bytes(len) as usize;
    if n > MAX_RECORD {
        return Found::Damaged;
    }
    if rest.len() < FRAME + n {
        return Found::Cut;
    }
    let sum = u64::from_le_bytes(rest[8..16].try_into().expect("8 bytes"));
    if checksum(seed, &len, &rest[FRAME..FRAME + n]) != sum {
        return Found::Damaged;
    }
    Found::Record(at + FRAME + n)
}

/// The first offset at or after `from` where a whole record begins.
fn next_record(bytes: &[u8], from: usize, seed: u64) -> Option<usize> {
    let mut at = from;
    while at + FRAME <= bytes.len() {
        let off = bytes[at..].windows(4).position(|w| w == SYNC)?;
        at += off;
        if let Found::Record(_) = record_at(bytes, at, seed) {
            return Some(at);
        }
        at += 1;
    }
    None
}

fn parse_header(bytes: &[u8]) -> Result<(Header, u64, usize), LogError> {
    if bytes.len() < 16 || &bytes[..8] != MAGIC {
        return Err(LogError::NotAStateFile);
    }
    let u32_at = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().expect("4 bytes"));
    let u64_at = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
    let format = u32_at(8);
    let length = u32_at(12) as usize;
    if !(16..=MAX_HEADER).contains(&length) || bytes.len() < length + 8 {
        return Err(LogError::DamagedHeader);
    }
    if xxh3_64_with_seed(&bytes[..length], 0) != u64_at(length) {
        return Err(LogError::DamagedHeader);
    }
    // Trusted only now: a damaged number is no newer format.
    if format > FORMAT {
        return Err(LogError::NewerFormat { found: format });
    }
    if length < HEADER_FIXED || HEADER_FIXED + u32_at(32) as usize != length {
        return Err(LogError::DamagedHeader);
    }
    let node_id = String::from_utf8(bytes[HEADER_FIXED..length].to_vec())
        .map_err(|_| LogError::DamagedHeader)?;
    let header = Header {
        format,
        node_id,
        begun_at: u64_at(24),
    };
    Ok((header, u64_at(16), length + 8))
}

#[cfg(test)]
#[path = "state_log_tests.rs"]
mod tests;
