//! Sequences handed between replicas through a directory every replica
//! mounts (`runtime.handoff_directory`).
//!
//! ```text
//! DIR/replicas/ID.lock          held locked (flock) by replica ID while it lives
//! DIR/owners/MODEL/KEY          the replica that keeps sequence KEY (written at its start)
//! DIR/handed/MODEL/KEY          a sequence's state, handed over (a one-sequence snapshot)
//! DIR/wanted/MODEL/KEY          a replica asks the keeper to hand KEY over
//! ```
//!
//! A replica that gets a tick of a sequence it does not keep *claims* it:
//! it renames the handed file to a name of its own (one rename wins, so two
//! replicas cannot both take a sequence), reads it and removes it. With no
//! handed file it reads the owner: none (or itself) means the sequence was
//! never started anywhere; a live owner is asked (a wanted file) and waited
//! for, at most `runtime.handoff_wait`; an owner whose lock is free died
//! without handing it over: the sequence's state is lost, said so, never
//! restarted silently. A replica that drains hands every sequence over; a
//! live one hands over what is wanted of it (a load balancer that moved a
//! sequence's ticks elsewhere, as when a drained replica comes back).
//!
//! Files are written beside their place and renamed into it, so a reader
//! sees a whole file or none. A replica's liveness is its lock: the kernel
//! frees it when the process dies, however it dies (on a network file
//! system, only where that system keeps `flock`).

#![allow(clippy::disallowed_methods)] // a claim polls the hand-over directory for at most a wait of the machine's time

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tickserve_core::sequence::SequenceId;

use super::{KeyIdOrd, SequenceKey};

/// How often a claim looks again while it waits for a live keeper.
const CLAIM_POLL: Duration = Duration::from_millis(5);

/// The most bytes of a handed file read (a sequence's state and windows).
const MAX_HANDED_BYTES: u64 = 256 * 1024 * 1024;

/// This replica's place in the hand-over directory.
#[derive(Debug)]
pub struct Handoff {
    dir: PathBuf,
    replica: String,
    wait: Duration,
    /// Held locked while the process lives.
    _lock: File,
}

/// What a claim found.
#[derive(Debug, PartialEq, Eq)]
pub enum Claimed {
    /// The sequence's state, handed over (a one-sequence snapshot's bytes).
    State(Vec<u8>),
    /// No replica keeps it: never started, or ended.
    NeverHeld,
    /// Replica `replica` kept it and stopped without handing it over.
    Lost {
        /// The replica.
        replica: String,
    },
    /// Live replica `replica` keeps it and did not hand it over in time.
    Busy {
        /// The replica.
        replica: String,
        /// How long the claim waited.
        waited: Duration,
    },
}

impl Handoff {
    /// Opens `dir` (making its folders) as replica `replica` (a name no
    /// other replica uses; the process's by default, see [`replica_name`]),
    /// and takes the replica's lock; claims wait at most `wait`.
    pub fn open(dir: &Path, replica: &str, wait: Duration) -> Result<Handoff, String> {
        let fail = |what: &str, e: std::io::Error| {
            format!(
                "runtime.handoff_directory {}: cannot {what}: {e}",
                dir.display()
            )
        };
        for area in ["replicas", "owners", "handed", "wanted"] {
            std::fs::create_dir_all(dir.join(area)).map_err(|e| fail("make its folders", e))?;
        }
        let lock = File::create(dir.join("replicas").join(format!("{replica}.lock")))
            .map_err(|e| fail("create this replica's lock", e))?;
        if !try_lock(&lock) {
            return Err(format!(
                "runtime.handoff_directory {}: replica name {replica} is in use by a live process",
                dir.display()
            ));
        }
        Ok(Handoff {
            dir: dir.to_path_buf(),
            replica: replica.to_string(),
            wait,
            _lock: lock,
        })
    }

    /// This replica's name.
    pub fn replica(&self) -> &str {
        &self.replica
    }

    /// How long a claim waits for a live keeper at most.
    pub fn wait(&self) -> Duration {
        self.wait
    }

    fn path(&self, area: &str, model: &str, key: &SequenceKey) -> PathBuf {
        self.dir
            .join(area)
            .join(folder_name(model))
            .join(file_name(key))
    }

    /// Records that this replica keeps `key` of `model` (a start, or a claim).
    pub fn keep(&self, model: &str, key: &SequenceKey) {
        let path = self.path("owners", model, key);
        if let Err(e) = write_whole(&path, self.replica.as_bytes()) {
            tracing::warn!(model, sequence = %key.id, error = %e, "cannot record the sequence's keeper");
        }
    }

    /// Records that `key` of `model` ended here (its owner file goes, if it
    /// names this replica).
    pub fn ended(&self, model: &str, key: &SequenceKey) {
        let path = self.path("owners", model, key);
        if read_small(&path).is_some_and(|owner| owner == self.replica) {
            let _ = std::fs::remove_file(path);
        }
    }

    /// Whether the owner file of `key` names this replica.
    pub fn keeps(&self, model: &str, key: &SequenceKey) -> bool {
        read_small(&self.path("owners", model, key)).is_some_and(|o| o == self.replica)
    }

    /// Hands `key` of `model` over: `state` (a one-sequence snapshot) as its
    /// handed file, and its wanted file, if any, gone.
    pub fn hand(&self, model: &str, key: &SequenceKey, state: &[u8]) -> Result<(), String> {
        write_whole(&self.path("handed", model, key), state)
            .map_err(|e| format!("cannot hand sequence {} over: {e}", key.id))?;
        let _ = std::fs::remove_file(self.path("wanted", model, key));
        Ok(())
    }

    /// Withdraws a request for `key` (it was answered, or is moot).
    pub fn unwant(&self, model: &str, key: &SequenceKey) {
        let _ = std::fs::remove_file(self.path("wanted", model, key));
    }

    /// The sequences of `model` some replica asked to be handed over.
    pub fn wanted(&self, model: &str) -> Vec<SequenceKey> {
        let Ok(entries) = std::fs::read_dir(self.dir.join("wanted").join(folder_name(model)))
        else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
            .filter_map(|e| read_small(&e.path()))
            .filter_map(|text| parse_key(&text))
            .collect()
    }

    /// Takes `key` of `model` for this replica: its handed state, or why
    /// there is none, waiting at most `wait` for a live keeper (see the
    /// module's notes). Blocking.
    pub fn claim(&self, model: &str, key: &SequenceKey, wait: Duration) -> Claimed {
        let started = Instant::now();
        let handed = self.path("handed", model, key);
        let mine = handed.with_file_name(format!(".claimed-{}-{}", self.replica, file_name(key)));
        let mut asked = false;
        let outcome = loop {
            if std::fs::rename(&handed, &mine).is_ok() {
                let bytes = read_limited(&mine);
                let _ = std::fs::remove_file(&mine);
                match bytes {
                    Some(bytes) => {
                        self.keep(model, key);
                        break Claimed::State(bytes);
                    }
                    None => {
                        break Claimed::Lost {
                            replica: "unknown (its handed state could not be read)".to_string(),
                        };
                    }
                }
            }
            let owner = match read_small(&self.path("owners", model, key)) {
                Some(owner) if owner != self.replica => owner,
                _ => break Claimed::NeverHeld,
            };
            if !self.alive(&owner) {
                // It may have handed the sequence over as it went.
                if handed.exists() {
                    continue;
                }
                break Claimed::Lost { replica: owner };
            }
            if !asked {
                let wanted = self.path("wanted", model, key);
                if let Err(e) = write_whole(&wanted, key_text(key).as_bytes()) {
                    tracing::warn!(model, sequence = %key.id, error = %e, "cannot ask for the sequence");
                }
                asked = true;
            }
            let waited = started.elapsed();
            if waited >= wait {
                break Claimed::Busy {
                    replica: owner,
                    waited,
                };
            }
            std::thread::sleep(CLAIM_POLL);
        };
        if asked {
            self.unwant(model, key);
        }
        outcome
    }

    /// Whether replica `replica` lives: its lock is held.
    fn alive(&self, replica: &str) -> bool {
        let path = self.dir.join("replicas").join(format!("{replica}.lock"));
        match File::open(path) {
            // Locked by its process: alive. We got it: nobody holds it.
            Ok(file) => !try_lock(&file),
            Err(_) => false,
        }
    }
}

/// A replica name no other process uses: the host's name, the process id
/// and the start time.
pub fn replica_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| {
            !h.is_empty()
                && h.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
        })
        .unwrap_or_else(|| "replica".to_string());
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    format!("{host}-{}-{since}", std::process::id())
}

/// Tries to lock `file` exclusively without waiting; true if locked now
/// (by this open file).
fn try_lock(file: &File) -> bool {
    #[cfg(unix)]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: flock on a file descriptor this `File` owns.
        unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
    }
    #[cfg(not(unix))]
    {
        let _ = file;
        true
    }
}

/// A model's folder name: its name where that is a plain file name, else
/// `x` and its bytes in hex.
fn folder_name(model: &str) -> String {
    let plain = !model.is_empty()
        && !model.starts_with('.')
        && model.len() <= 200
        && model
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if plain {
        model.to_string()
    } else {
        format!("x{}", hex(model.as_bytes()))
    }
}

/// A sequence's file name: its key's owner (with `bind_to_key`), then
/// `n` and its number, or `t` and the SHA-256 of its text (a text id may
/// hold any byte and be longer than a file name may).
fn file_name(key: &SequenceKey) -> String {
    let owner = key
        .owner
        .map_or_else(String::new, |o| format!("k{}-", hex(&o.0)));
    match &key.id {
        SequenceId::Number(n) => format!("{owner}n{n}"),
        SequenceId::Text(text) => format!("{owner}t{}", hex(&Sha256::digest(text.as_bytes()))),
    }
}

/// A key as a wanted file holds it: the owner's hex or `-`, a newline, then
/// `n` and the number or `t` and the text.
fn key_text(key: &SequenceKey) -> String {
    let owner = key.owner.map_or_else(|| "-".to_string(), |o| hex(&o.0));
    match &key.id {
        SequenceId::Number(n) => format!("{owner}\nn{n}"),
        SequenceId::Text(text) => format!("{owner}\nt{text}"),
    }
}

fn parse_key(text: &str) -> Option<SequenceKey> {
    let (owner, id) = text.split_once('\n')?;
    let owner = match owner {
        "-" => None,
        hexed => {
            let bytes = unhex(hexed)?;
            Some(KeyIdOrd(bytes.try_into().ok()?))
        }
    };
    let id = if let Some(n) = id.strip_prefix('n') {
        SequenceId::Number(n.parse().ok()?)
    } else {
        SequenceId::Text(id.strip_prefix('t')?.to_string())
    };
    Some(SequenceKey { owner, id })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Writes `bytes` to a file beside `path`, then renames it into place (a
/// reader sees the old file, or this one whole).
fn write_whole(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let name = path
        .file_name()
        .map_or_else(Default::default, |n| n.to_os_string());
    let mut temporary = std::ffi::OsString::from(".");
    temporary.push(&name);
    temporary.push(format!(".{}", std::process::id()));
    let temporary = path.with_file_name(temporary);
    let mut file = File::create(&temporary)?;
    file.write_all(bytes)?;
    drop(file);
    std::fs::rename(&temporary, path)
}

/// A small file's text (an owner's name, a wanted key), if it is there.
fn read_small(path: &Path) -> Option<String> {
    use std::io::Read;
    let mut text = String::new();
    File::open(path)
        .ok()?
        .take(4096)
        .read_to_string(&mut text)
        .ok()?;
    Some(text)
}

fn read_limited(path: &Path) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    File::open(path)
        .ok()?
        .take(MAX_HANDED_BYTES)
        .read_to_end(&mut bytes)
        .ok()?;
    Some(bytes)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn key(id: SequenceId, owner: Option<[u8; 8]>) -> SequenceKey {
        SequenceKey {
            owner: owner.map(KeyIdOrd),
            id,
        }
    }

    #[test]
    fn keys_survive_their_wanted_file_and_text_ids_get_short_file_names() {
        for k in [
            key(SequenceId::Number(42), None),
            key(SequenceId::Text("AAPL\nline two/..".into()), Some([7; 8])),
            key(SequenceId::Text("x".repeat(256)), None),
        ] {
            assert_eq!(parse_key(&key_text(&k)), Some(k.clone()));
            let name = file_name(&k);
            assert!(name.len() <= 100 && !name.contains('/'), "{name}");
        }
        assert_eq!(folder_name("seq_lstm_step"), "seq_lstm_step");
        assert_eq!(folder_name("../etc"), "x2e2e2f657463");
    }

    #[test]
    fn one_claim_wins_a_handed_sequence_and_a_dead_keeper_loses_it() {
        let dir = tempfile::tempdir().unwrap();
        let wait = Duration::from_millis(200);
        let a = Handoff::open(dir.path(), "a", wait).unwrap();
        let b = Handoff::open(dir.path(), "b", wait).unwrap();
        assert!(
            Handoff::open(dir.path(), "a", wait).is_err(),
            "a name in use"
        );
        let k = key(SequenceId::Number(7), None);
        // Never started anywhere.
        assert_eq!(b.claim("m", &k, wait), Claimed::NeverHeld);
        // Kept by a, which hands it over: b takes it, once.
        a.keep("m", &k);
        a.hand("m", &k, b"state").unwrap();
        assert_eq!(b.claim("m", &k, wait), Claimed::State(b"state".to_vec()));
        assert!(b.keeps("m", &k) && !a.keeps("m", &k));
        // Now b keeps it, alive, and does not answer: a waits, then gives up.
        let busy = a.claim("m", &k, Duration::from_millis(20));
        assert!(
            matches!(&busy, Claimed::Busy { replica, waited } if replica == "b"
                && *waited >= Duration::from_millis(20)),
            "{busy:?}"
        );
        assert!(b.wanted("m").is_empty(), "a withdrew its request");
        // b is gone without handing it over: lost.
        drop(b);
        assert_eq!(
            a.claim("m", &k, wait),
            Claimed::Lost {
                replica: "b".to_string()
            }
        );
    }

    #[test]
    fn a_live_keeper_asked_for_a_sequence_hands_it_over_while_the_claim_waits() {
        let dir = tempfile::tempdir().unwrap();
        let wait = Duration::from_secs(5);
        let a = Handoff::open(dir.path(), "a", wait).unwrap();
        let b = Handoff::open(dir.path(), "b", wait).unwrap();
        let k = key(SequenceId::Text("EURUSD".into()), Some([1; 8]));
        b.keep("m", &k);
        let claim = std::thread::spawn(move || a.claim("m", &k, wait));
        let asked = loop {
            let wanted = b.wanted("m");
            if !wanted.is_empty() {
                break wanted;
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        assert_eq!(
            asked,
            [key(SequenceId::Text("EURUSD".into()), Some([1; 8]))]
        );
        b.hand("m", &asked[0], b"windows").unwrap();
        assert_eq!(claim.join().unwrap(), Claimed::State(b"windows".to_vec()));
        assert!(b.wanted("m").is_empty());
    }
}
