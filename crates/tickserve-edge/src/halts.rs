//! The kill switch: model versions halted by an operator (`POST
//! .../versions/V/halt`) or by their breaker, answered by nothing until
//! resumed. The table is checked on every request, after the model lookup
//! (one relaxed atomic load while nothing is halted), and kept in
//! `[risk] halts_file` when set: rewritten at every change (written beside
//! it, then renamed over it) and read at start, so a halt outlives a restart
//! and a reload (a reload replaces the version's handle, not its halt).
//! In a fleet (`[fleet]`) every halt and resume is also written to the
//! fleet's store, one key per version, and each replica's table follows
//! the store's changes: a halt sent to one replica halts the version on
//! every replica, and outlives every restart.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, RwLock, Weak};

use serde::{Deserialize, Serialize};
use tickserve_core::Error;
use tickserve_core::fleet::{HaltRecord, HaltsFleet, Propagation};
use tickserve_journal::Journal;
use tickserve_runtime::ModelHandle;

/// The longest reason kept, in bytes (a longer one is cut at a character).
pub const MAX_REASON_BYTES: usize = 512;

/// The largest halts file read at start.
const MAX_FILE_BYTES: u64 = 1 << 20;

/// One halted version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Halt {
    /// Why (the operator's words, or the breaker's count).
    pub reason: String,
    /// Who halted it: `api` or `breaker`.
    pub by: String,
    /// When, RFC 3339 UTC.
    pub since: String,
}

impl Halt {
    /// The words a refused request gets.
    pub fn words(&self) -> String {
        let by = if self.by == "breaker" {
            "by its breaker"
        } else {
            "by the API"
        };
        format!("{by} since {}: {}", self.since, self.reason)
    }

    /// What a request to `handle`'s halted version is answered.
    pub fn refusal(&self, handle: &ModelHandle) -> Error {
        Error::Halted {
            model: handle.name.clone(),
            version: handle.version.clone(),
            reason: self.words(),
        }
    }
}

/// What a halt or resume did.
#[derive(Debug)]
pub struct Changed<T> {
    /// The halt in force (a halt), or the one lifted (a resume).
    pub halt: T,
    /// Whether it was kept: in the fleet's store and applied by every live
    /// replica, or else in the halts file (`Err`: why not; it applies here
    /// all the same).
    pub kept: Result<(), String>,
    /// How far it got across the fleet, with `[fleet]`.
    pub fleet: Option<Propagation>,
}

/// The halted versions, by `(model, version)`.
pub struct Halts {
    file: Option<PathBuf>,
    any: AtomicBool,
    table: RwLock<BTreeMap<(String, String), Halt>>,
    /// Where halts and resumes are recorded, beside the version's
    /// predictions (status `halted` or `resumed`, the words as the error).
    journal: Option<Arc<Journal>>,
    /// The fleet's store, with `[fleet]`, and where its writes run.
    fleet: OnceLock<(Arc<dyn HaltsFleet>, tokio::runtime::Handle)>,
}

impl std::fmt::Debug for Halts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Halts")
            .field("file", &self.file)
            .field("table", &self.all())
            .finish_non_exhaustive()
    }
}

/// The file's form: `{"model/version": Halt}`.
type Stored = BTreeMap<String, Halt>;

impl Halts {
    /// No halt, none kept beyond the process.
    pub fn in_memory() -> Halts {
        Halts {
            file: None,
            any: AtomicBool::new(false),
            table: RwLock::new(BTreeMap::new()),
            journal: None,
            fleet: OnceLock::new(),
        }
    }

    /// These halts, recording each halt and resume in `journal`.
    pub fn with_journal(mut self, journal: Option<Arc<Journal>>) -> Halts {
        self.journal = journal;
        self
    }

    /// The halts kept in `file` (none when it does not exist yet); a file
    /// that cannot be read or parsed stops the start, naming it (a halt an
    /// operator set must not be dropped silently).
    pub fn open(file: Option<PathBuf>) -> Result<Halts, String> {
        let table = match &file {
            Some(path) => read(path)?,
            None => BTreeMap::new(),
        };
        let halts = Halts {
            file,
            any: AtomicBool::new(!table.is_empty()),
            table: RwLock::new(table),
            journal: None,
            fleet: OnceLock::new(),
        };
        for ((model, version), _) in halts.all() {
            gauge(&model, &version, true);
        }
        Ok(halts)
    }

    /// `model` `version`'s halt, if it is halted. Halts are few (an
    /// operator's or a breaker's): a walk over them, nothing allocated on the
    /// request's way.
    pub fn check(&self, model: &str, version: &str) -> Option<Halt> {
        if !self.any.load(Ordering::Relaxed) {
            return None;
        }
        let table = self.table.read().unwrap_or_else(|p| p.into_inner());
        table
            .iter()
            .find(|((m, v), _)| m == model && v == version)
            .map(|(_, halt)| halt.clone())
    }

    /// Follows the fleet's halts from now on: this table takes every halt
    /// in the store (returns once it has, so that nothing is served before
    /// the fleet's halts are known), then each change; halts and resumes
    /// made here are written there. Set once.
    pub async fn follow_fleet(self: &Arc<Self>, fleet: Arc<dyn HaltsFleet>) -> Result<(), String> {
        if self
            .fleet
            .set((Arc::clone(&fleet), tokio::runtime::Handle::current()))
            .is_err()
        {
            return Ok(());
        }
        let halts: Weak<Halts> = Arc::downgrade(self);
        let (read, first) = tokio::sync::oneshot::channel();
        let read = std::sync::Mutex::new(Some(read));
        fleet.follow(Box::new(move |records, reset| {
            if let Some(halts) = halts.upgrade() {
                halts.apply(records, reset);
            }
            if let Some(read) = read.lock().unwrap_or_else(|p| p.into_inner()).take() {
                let _ = read.send(());
            }
        }));
        match tokio::time::timeout(std::time::Duration::from_secs(10), first).await {
            Ok(Ok(())) => Ok(()),
            _ => Err("the fleet's halts could not be read from its store within 10 s".to_string()),
        }
    }

    /// Applies halts read from the fleet's store (`reset`: they are every
    /// halt there is).
    fn apply(&self, records: Vec<HaltRecord>, reset: bool) {
        let mut table = self.table.write().unwrap_or_else(|p| p.into_inner());
        let before = table.clone();
        if reset {
            table.clear();
        }
        for record in records {
            let key = (record.model, record.version);
            match record
                .halt
                .and_then(|b| serde_json::from_slice::<Halt>(&b).ok())
            {
                Some(halt) => {
                    table.insert(key, halt);
                }
                None => {
                    table.remove(&key);
                }
            }
        }
        self.any.store(!table.is_empty(), Ordering::Relaxed);
        for (model, version) in before.keys().filter(|k| !table.contains_key(*k)) {
            gauge(model, version, false);
            tracing::warn!(model, version, "version resumed across the fleet");
        }
        for ((model, version), halt) in table.iter().filter(|(k, _)| !before.contains_key(*k)) {
            gauge(model, version, true);
            tracing::warn!(model, version, reason = %halt.reason, "version halted across the fleet");
        }
        if let Err(e) = self.keep(&table) {
            tracing::error!("the halts file cannot follow the fleet: {e}");
        }
    }

    /// Writes `model` `version`'s halt (`None`: its resume) to the fleet's
    /// store, if there is one, and how far it got: `Err` when the store did
    /// not take it, or a live replica had not applied it in time.
    async fn publish(
        &self,
        model: &str,
        version: &str,
        halt: Option<&Halt>,
    ) -> (Result<(), String>, Option<Propagation>) {
        let Some((fleet, _)) = self.fleet.get() else {
            return (Ok(()), None);
        };
        let record = HaltRecord {
            model: model.to_string(),
            version: version.to_string(),
            halt: halt.map(|h| serde_json::to_vec(h).unwrap_or_default()),
        };
        match fleet.write(record).await {
            Ok(p) if p.applied >= p.replicas => (Ok(()), Some(p)),
            Ok(p) => (
                Err(format!(
                    "kept in the fleet's store, applied on {} of its {} replicas within {:?}; \
                     the others apply it when they reach the store",
                    p.applied, p.replicas, p.waited
                )),
                Some(p),
            ),
            Err(e) => (Err(format!("the fleet's store did not take it: {e}")), None),
        }
    }

    /// Halts `handle`'s version, asked over `via` (`http` or `grpc`); a
    /// version halted already keeps its first halt. Returns once the halt
    /// is kept (in the fleet's store, applied by every live replica; or
    /// else the halts file; `kept` says why not: it applies here all the
    /// same). A new halt is journaled when the journal takes the model.
    pub async fn halt(
        &self,
        handle: &Arc<ModelHandle>,
        reason: &str,
        via: &'static str,
    ) -> Changed<Halt> {
        let (halt, new, kept) = self.set(&handle.name, &handle.version, reason, "api");
        if new {
            self.record(handle, via, "halted", halt.words());
        }
        let (published, fleet) = self
            .publish(&handle.name, &handle.version, Some(&halt))
            .await;
        Changed {
            halt,
            kept: kept.and(published),
            fleet,
        }
    }

    /// Halts `handle`'s version for its breaker, from the request's path:
    /// the fleet's store is written on the fleet's task.
    pub fn halt_by_breaker(&self, handle: &Arc<ModelHandle>, reason: &str) {
        let (halt, new, _) = self.set(&handle.name, &handle.version, reason, "breaker");
        if !new {
            return;
        }
        self.record(handle, "breaker", "halted", halt.words());
        if let Some((fleet, runtime)) = self.fleet.get() {
            let (fleet, model, version) = (
                Arc::clone(fleet),
                handle.name.clone(),
                handle.version.clone(),
            );
            let bytes = serde_json::to_vec(&halt).unwrap_or_default();
            runtime.spawn(async move {
                let record = HaltRecord {
                    model,
                    version,
                    halt: Some(bytes),
                };
                if let Err(e) = fleet.write(record).await {
                    tracing::error!(error = %e, "a breaker's halt did not reach the fleet's store");
                }
            });
        }
    }

    /// Resumes `handle`'s version, asked over `via`: its halt, if it had
    /// one, and whether the resume was kept (the fleet's store, applied by
    /// every live replica; or else the halts file).
    pub async fn resume(
        &self,
        handle: &Arc<ModelHandle>,
        via: &'static str,
    ) -> Changed<Option<Halt>> {
        let (halt, kept) = self.clear(&handle.name, &handle.version);
        if let Some(halt) = &halt {
            let words = format!("resumed; it was halted {}", halt.words());
            self.record(handle, via, "resumed", words);
        }
        let (published, fleet) = self.publish(&handle.name, &handle.version, None).await;
        Changed {
            halt,
            kept: kept.and(published),
            fleet,
        }
    }

    /// Halts `model` `version` (`by`: `api` or `breaker`): the halt in
    /// force, whether it is new, and whether the file was rewritten.
    #[allow(clippy::disallowed_methods)] // a halt says since when on the wall clock
    fn set(
        &self,
        model: &str,
        version: &str,
        reason: &str,
        by: &str,
    ) -> (Halt, bool, Result<(), String>) {
        let mut table = self.table.write().unwrap_or_else(|p| p.into_inner());
        let key = (model.to_string(), version.to_string());
        if let Some(halt) = table.get(&key) {
            return (halt.clone(), false, Ok(()));
        }
        let halt = Halt {
            reason: clip(reason),
            by: by.to_string(),
            since: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        };
        table.insert(key, halt.clone());
        self.any.store(true, Ordering::Relaxed);
        gauge(model, version, true);
        tracing::warn!(model, version, by, reason = %halt.reason, "version halted");
        let kept = self.keep(&table);
        (halt, true, kept)
    }

    /// Resumes `model` `version`: its halt, if it had one, and whether the
    /// file was rewritten.
    fn clear(&self, model: &str, version: &str) -> (Option<Halt>, Result<(), String>) {
        let mut table = self.table.write().unwrap_or_else(|p| p.into_inner());
        let halt = table.remove(&(model.to_string(), version.to_string()));
        self.any.store(!table.is_empty(), Ordering::Relaxed);
        let kept = match &halt {
            Some(_) => {
                gauge(model, version, false);
                tracing::warn!(model, version, "version resumed");
                self.keep(&table)
            }
            None => Ok(()),
        };
        (halt, kept)
    }

    /// A halt or resume of `handle`'s version as a journal record: status
    /// `status`, `words` as its error, the front end it came over.
    fn record(
        &self,
        handle: &Arc<ModelHandle>,
        via: &'static str,
        status: &'static str,
        words: String,
    ) {
        if let Some(journal) = self.journal.as_ref().filter(|j| j.wants(handle)) {
            super::journal::event(journal, handle, via, status, words);
        }
    }

    /// Halts that name no version of the loaded models (`known` says which
    /// versions exist), each logged by name: a halt is kept for a version
    /// that may come back, but an operator should know it guards nothing.
    pub fn unmatched(&self, known: impl Fn(&str, &str) -> bool) -> Vec<(String, String)> {
        let unmatched: Vec<(String, String)> = self
            .all()
            .into_iter()
            .map(|(at, _)| at)
            .filter(|(model, version)| !known(model, version))
            .collect();
        for (model, version) in &unmatched {
            tracing::warn!(
                model,
                version,
                "a kept halt names a version that is not loaded: it applies if that version loads"
            );
        }
        unmatched
    }

    /// Every halt.
    pub fn all(&self) -> Vec<((String, String), Halt)> {
        let table = self.table.read().unwrap_or_else(|p| p.into_inner());
        table.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }

    /// Rewrites the halts file with `table`.
    fn keep(&self, table: &BTreeMap<(String, String), Halt>) -> Result<(), String> {
        let Some(path) = &self.file else {
            return Ok(());
        };
        let stored: Stored = table
            .iter()
            .map(|((model, version), halt)| (format!("{model}/{version}"), halt.clone()))
            .collect();
        let text = serde_json::to_string_pretty(&stored).map_err(|e| e.to_string())?;
        write_durably(path, text.as_bytes()).map_err(|e| {
            let message = format!("{}: {e}", path.display());
            tracing::error!("the halts file cannot be written: {message}");
            message
        })
    }
}

/// Who may halt and resume, on each front end: the `risk` key group is
/// closed unless `[[security.restricted]]` gives it a key there, or
/// `[risk] control = "open"`; a breaker's halt is lifted only with the key.
#[derive(Debug, Clone, Copy)]
pub struct RiskAccess {
    open: bool,
    keyed_http: bool,
    keyed_grpc: bool,
}

impl RiskAccess {
    /// The access `config` gives.
    pub fn of(config: &tickserve_core::config::ServerConfig) -> RiskAccess {
        use tickserve_core::config::{EndpointGroup, FrontEnd, RiskControl};
        let keyed = |front_end: FrontEnd| {
            config.security.restricted.iter().any(|r| {
                r.groups.contains(&EndpointGroup::Risk) && r.front_ends.contains(&front_end)
            })
        };
        RiskAccess {
            open: config.risk.control == RiskControl::Open,
            keyed_http: keyed(FrontEnd::Http),
            keyed_grpc: keyed(FrontEnd::Grpc),
        }
    }

    /// Whether `ask` may be asked of `model` over `front_end` (whose access
    /// check has already asked for the key, where it has one).
    pub fn allows(
        &self,
        front_end: tickserve_core::config::FrontEnd,
        model: &str,
        ask: RiskAsk<'_>,
    ) -> Result<(), Error> {
        let keyed = match front_end {
            tickserve_core::config::FrontEnd::Http => self.keyed_http,
            tickserve_core::config::FrontEnd::Grpc => self.keyed_grpc,
        };
        let (operation, lifting) = match ask {
            RiskAsk::Halt => ("halt", None),
            RiskAsk::Resume(lifting) => ("resume", lifting),
        };
        let refused = |reason| {
            Err(Error::RiskControl {
                model: model.to_string(),
                operation,
                reason,
            })
        };
        if !keyed && !self.open {
            return refused(
                "the risk key group is closed: give it a key ([[security.restricted]] with \
                 groups = [\"risk\"]) or open it on purpose ([risk] control = \"open\")",
            );
        }
        if !keyed && lifting.is_some_and(|h| h.by == "breaker") {
            return refused(
                "a breaker's halt is lifted only with the risk key group's key \
                 ([[security.restricted]] with groups = [\"risk\"])",
            );
        }
        Ok(())
    }
}

/// What is asked of the kill switch.
#[derive(Debug, Clone, Copy)]
pub enum RiskAsk<'a> {
    /// A halt.
    Halt,
    /// A resume, lifting this halt if the version has one.
    Resume(Option<&'a Halt>),
}

/// Writes `bytes` to a file beside `path`, syncs it, renames it over
/// `path` and syncs the folder: after a power loss the file is the old one
/// or the new one, whole, never empty or torn.
fn write_durably(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let folder = path
        .parent()
        .filter(|dir| !dir.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(folder)?;
    // A name of this process's own: replicas that share the file never
    // write into each other's half-written copy.
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{}.writing", std::process::id()));
    let beside = path.with_file_name(name);
    let mut file = std::fs::File::create(&beside)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&beside, path)?;
    std::fs::File::open(folder)?.sync_all()
}

/// The version a halt or resume names: it must be given (a halt is of one
/// version, never "whichever is the default now") and be one the server has
/// (a label names its version).
pub fn version_of(
    edge: &super::Edge,
    model: &str,
    version: Option<&str>,
) -> Result<Arc<ModelHandle>, tickserve_core::Error> {
    let Some(version) = version.filter(|v| !v.is_empty()) else {
        return Err(tickserve_core::Error::request(
            model,
            "a halt or resume names its version: POST /v2/models/MODEL/versions/VERSION/halt",
        ));
    };
    edge.runtime.model(model, Some(version))
}

/// The halts in `path`; none when it does not exist.
fn read(path: &Path) -> Result<BTreeMap<(String, String), Halt>, String> {
    let shown = path.display();
    let bytes = match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(e) => return Err(format!("risk.halts_file {shown}: {e}")),
        Ok(meta) if !meta.is_file() => {
            return Err(format!("risk.halts_file {shown}: not a regular file"));
        }
        Ok(meta) if meta.len() > MAX_FILE_BYTES => {
            return Err(format!(
                "risk.halts_file {shown}: {} bytes, over the {MAX_FILE_BYTES} read",
                meta.len()
            ));
        }
        Ok(_) => std::fs::read(path).map_err(|e| format!("risk.halts_file {shown}: {e}"))?,
    };
    let stored: Stored = serde_json::from_slice(&bytes)
        .map_err(|e| format!("risk.halts_file {shown}: not a halts file: {e}"))?;
    stored
        .into_iter()
        .map(|(key, halt)| match key.rsplit_once('/') {
            Some((model, version)) if canonical(version) && !model.is_empty() => {
                Ok(((model.to_string(), version.to_string()), halt))
            }
            Some((_, version)) => Err(format!(
                "risk.halts_file {shown}: '{key}' names version '{version}'; a halt names \
                 one version by its number as the repository writes it (1, 2, ...), never \
                 a label or another spelling"
            )),
            None => Err(format!(
                "risk.halts_file {shown}: '{key}' is not MODEL/VERSION"
            )),
        })
        .collect()
}

/// Whether `version` is a version number as the repository writes it.
fn canonical(version: &str) -> bool {
    version
        .parse::<u64>()
        .is_ok_and(|n| n > 0 && n.to_string() == version)
}

/// `reason` cut to [`MAX_REASON_BYTES`] at a character.
fn clip(reason: &str) -> String {
    let reason = reason.trim();
    if reason.is_empty() {
        return "no reason given".to_string();
    }
    let mut end = reason.len().min(MAX_REASON_BYTES);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    reason[..end].to_string()
}

fn gauge(model: &str, version: &str, halted: bool) {
    metrics::gauge!(tickserve_core::metrics::MODEL_HALTED,
        "model" => model.to_string(), "version" => version.to_string())
    .set(if halted { 1.0 } else { 0.0 });
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_halt_is_kept_in_its_file_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("halts.json");
        let halts = Halts::open(Some(file.clone())).unwrap();
        assert_eq!(halts.check("m", "1"), None);
        let (halt, new, kept) = halts.set("m", "1", "  bad fills  ", "api");
        assert!(new && kept.is_ok());
        assert_eq!(
            (halt.reason.as_str(), halt.by.as_str()),
            ("bad fills", "api")
        );
        // A second halt keeps the first.
        let (again, new, _) = halts.set("m", "1", "other", "breaker");
        assert_eq!((again, new), (halt.clone(), false));
        let reopened = Halts::open(Some(file.clone())).unwrap();
        assert_eq!(reopened.check("m", "1"), Some(halt.clone()));
        assert_eq!(reopened.check("m", "2"), None);
        let (resumed, kept) = reopened.clear("m", "1");
        assert_eq!(resumed, Some(halt));
        assert!(kept.is_ok());
        assert_eq!(Halts::open(Some(file)).unwrap().all(), Vec::new());
    }

    #[test]
    fn a_bad_halts_file_stops_the_start_and_reasons_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("halts.json");
        std::fs::write(&file, "not json").unwrap();
        let error = Halts::open(Some(file.clone())).unwrap_err();
        assert!(error.contains("not a halts file"), "{error}");
        std::fs::write(
            &file,
            r#"{"noversion": {"reason": "r", "by": "api", "since": "s"}}"#,
        )
        .unwrap();
        assert!(
            Halts::open(Some(file.clone()))
                .unwrap_err()
                .contains("MODEL/VERSION")
        );
        for bad in ["k/stable", "k2/01", "k/0"] {
            std::fs::write(
                &file,
                format!(r#"{{"{bad}": {{"reason": "r", "by": "api", "since": "s"}}}}"#),
            )
            .unwrap();
            let error = Halts::open(Some(file.clone())).unwrap_err();
            assert!(error.contains("names version"), "{bad}: {error}");
        }
        std::fs::write(
            &file,
            r#"{"k/2": {"reason": "r", "by": "api", "since": "s"}, "gone/1": {"reason": "r", "by": "api", "since": "s"}}"#,
        )
        .unwrap();
        let halts = Halts::open(Some(file.clone())).unwrap();
        assert_eq!(
            halts.unmatched(|model, _| model == "k"),
            [("gone".to_string(), "1".to_string())]
        );
        assert_eq!(clip(""), "no reason given");
        assert_eq!(clip(&"é".repeat(400)).len(), MAX_REASON_BYTES);
        // A cut that falls inside a character steps back to its start.
        let odd = format!("a{}", "é".repeat(400));
        assert_eq!(clip(&odd), format!("a{}", "é".repeat(255)));
    }

    #[test]
    fn a_refusal_says_who_halted_and_since_when() {
        let halt = |by: &str| Halt {
            reason: "fat fingers".into(),
            by: by.into(),
            since: "2026-12-04T10:00:00Z".into(),
        };
        assert_eq!(
            halt("api").words(),
            "by the API since 2026-12-04T10:00:00Z: fat fingers"
        );
        assert_eq!(
            halt("breaker").words(),
            "by its breaker since 2026-12-04T10:00:00Z: fat fingers"
        );
    }

    fn record(model: &str, version: &str, reason: Option<&str>) -> HaltRecord {
        HaltRecord {
            model: model.into(),
            version: version.into(),
            halt: reason.map(|r| {
                serde_json::to_vec(&Halt {
                    reason: r.into(),
                    by: "api".into(),
                    since: "s".into(),
                })
                .unwrap()
            }),
        }
    }

    #[test]
    fn the_fleets_halts_apply_here_and_reach_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("halts.json");
        let halts = Halts::open(Some(file.clone())).unwrap();
        halts.apply(
            vec![record("m", "1", Some("a")), record("m", "2", Some("b"))],
            false,
        );
        assert_eq!(halts.check("m", "1").map(|h| h.reason), Some("a".into()));
        assert_eq!(halts.check("m", "2").map(|h| h.reason), Some("b".into()));
        let kept = Halts::open(Some(file.clone())).unwrap();
        assert!(kept.check("m", "1").is_some() && kept.check("m", "2").is_some());
        // A resume, and a record that is not a halt, lift that version only.
        halts.apply(vec![record("m", "1", None)], false);
        assert_eq!(halts.check("m", "1"), None);
        assert!(halts.check("m", "2").is_some());
        let mut garbled = record("m", "2", None);
        garbled.halt = Some(b"not a halt".to_vec());
        halts.apply(vec![garbled, record("k", "3", Some("c"))], false);
        assert_eq!(halts.check("m", "2"), None);
        assert!(halts.check("k", "3").is_some());
        // A reset is every halt there is.
        halts.apply(vec![record("n", "4", Some("d"))], true);
        assert_eq!(halts.check("k", "3"), None);
        assert!(halts.check("n", "4").is_some());
        halts.apply(Vec::new(), true);
        assert_eq!(halts.all(), Vec::new());
        assert_eq!(Halts::open(Some(file)).unwrap().all(), Vec::new());
    }

    #[test]
    fn resuming_one_of_two_halts_leaves_the_other_halted() {
        let halts = Halts::in_memory();
        assert!(halts.set("m", "1", "a", "api").2.is_ok());
        assert!(halts.set("m", "2", "b", "api").2.is_ok());
        let (lifted, _) = halts.clear("m", "1");
        assert!(lifted.is_some());
        assert_eq!(halts.check("m", "1"), None);
        assert!(halts.check("m", "2").is_some());
        assert_eq!(halts.clear("m", "1").0, None, "nothing left to lift");
    }

    #[test]
    fn a_halts_file_that_is_a_folder_unreadable_or_over_the_limit_stops_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let error = Halts::open(Some(dir.path().to_path_buf())).unwrap_err();
        assert!(error.contains("not a regular file"), "{error}");
        let file = dir.path().join("halts.json");
        std::fs::write(&file, "{}").unwrap();
        // Under a file: an error other than "not found" is not "no halts".
        let error = Halts::open(Some(file.join("below"))).unwrap_err();
        assert!(error.contains("risk.halts_file"), "{error}");
        let limit = usize::try_from(MAX_FILE_BYTES).unwrap();
        let padded = format!("{{}}{}", " ".repeat(limit - 2));
        std::fs::write(&file, &padded).unwrap();
        assert_eq!(Halts::open(Some(file.clone())).unwrap().all(), Vec::new());
        std::fs::write(&file, format!("{padded} ")).unwrap();
        let error = Halts::open(Some(file)).unwrap_err();
        assert!(error.contains("over the 1048576 read"), "{error}");
    }

    fn access(control: tickserve_core::config::RiskControl, keyed: &[FrontEnd]) -> RiskAccess {
        let mut config = tickserve_core::config::ServerConfig::default();
        config.risk.control = control;
        if !keyed.is_empty() {
            config
                .security
                .restricted
                .push(tickserve_core::config::Restriction {
                    groups: vec![tickserve_core::config::EndpointGroup::Risk],
                    header: "risk-key".into(),
                    key_file: None,
                    key_env: Some("RISK_KEY".into()),
                    key_literal: None,
                    front_ends: keyed.to_vec(),
                });
        }
        RiskAccess::of(&config)
    }

    use tickserve_core::config::FrontEnd;

    #[test]
    fn the_risk_group_is_closed_without_a_key_and_a_breakers_halt_needs_one() {
        use tickserve_core::config::RiskControl::{Closed, Open};
        let by_breaker = Halt {
            reason: "r".into(),
            by: "breaker".into(),
            since: "s".into(),
        };
        let by_api = Halt {
            by: "api".into(),
            ..by_breaker.clone()
        };
        let ok = |a: &RiskAccess, f, ask| a.allows(f, "m", ask).is_ok();
        // Closed, no key: nothing is allowed, and the refusal says how to open it.
        let closed = access(Closed, &[]);
        for front_end in [FrontEnd::Http, FrontEnd::Grpc] {
            assert!(!ok(&closed, front_end, RiskAsk::Halt));
            assert!(!ok(&closed, front_end, RiskAsk::Resume(None)));
        }
        let error = closed
            .allows(FrontEnd::Http, "m", RiskAsk::Halt)
            .unwrap_err();
        assert!(
            error.to_string().contains("risk key group is closed"),
            "{error}"
        );
        // A key on HTTP only: HTTP may, gRPC may not; with the key a
        // breaker's halt is lifted.
        let http = access(Closed, &[FrontEnd::Http]);
        assert!(ok(&http, FrontEnd::Http, RiskAsk::Halt));
        assert!(ok(
            &http,
            FrontEnd::Http,
            RiskAsk::Resume(Some(&by_breaker))
        ));
        assert!(!ok(&http, FrontEnd::Grpc, RiskAsk::Halt));
        let grpc = access(Closed, &[FrontEnd::Grpc]);
        assert!(ok(&grpc, FrontEnd::Grpc, RiskAsk::Halt));
        assert!(!ok(&grpc, FrontEnd::Http, RiskAsk::Halt));
        // Open on purpose: halts and resumes answer without a key, but not
        // the lifting of a breaker's halt.
        let open = access(Open, &[]);
        assert!(ok(&open, FrontEnd::Grpc, RiskAsk::Halt));
        assert!(ok(&open, FrontEnd::Http, RiskAsk::Resume(Some(&by_api))));
        assert!(ok(&open, FrontEnd::Http, RiskAsk::Resume(None)));
        let error = open
            .allows(FrontEnd::Http, "m", RiskAsk::Resume(Some(&by_breaker)))
            .unwrap_err();
        assert!(error.to_string().contains("a breaker's halt"), "{error}");
    }
}
