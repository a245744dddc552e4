//! Reading a model's files: whatever the server reads from a model repository
//! is as hostile as a request, since whoever can write into a polled
//! repository need not be whoever runs the server. Every file read for a model
//! (`model.toml`, `labels.toml`, initial files, `model.onnx`) comes through
//! [`read`], which reads only a regular file inside the model's directory:
//!
//! - the name is relative, without `..` (`"h0.bin"`, `"1/model.onnx"`);
//! - the path, symbolic links resolved, stays inside the model's directory
//!   (links within it, as Kubernetes' ConfigMap volumes make, are fine);
//! - the file is opened non-blocking and without following a last link (a
//!   FIFO never blocks the reader), and must be a regular file (not a FIFO,
//!   a device such as `/dev/zero`, a socket or a directory);
//! - it is read up to a limit, never past it.
//!
//! Errors name the file as the repository does (`alpha/model.toml`), never by
//! the server's path, and say the same for a link leading out, a dangling link
//! and a file that is not regular: they reach clients (load failures, the
//! repository index), who learn nothing of files outside the repository,
//! not even whether one exists or how large it is. [`toml_error`] writes a
//! parse error as the file, line and column, without the lines themselves.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path};

/// The most bytes of a `model.toml` or `labels.toml`.
pub const MAX_CONFIG_BYTES: u64 = 64 * 1024;

/// The most bytes of a `model.onnx`: protobuf's own limit for one message.
pub const MAX_ONNX_BYTES: u64 = 2 * 1024 * 1024 * 1024;

/// Why a model's file was not read; displayed as the file's name as the
/// repository shows it and what was wrong.
#[derive(Debug, Clone, PartialEq, Eq, Hash, thiserror::Error)]
#[error("{shown}: {problem}")]
pub struct FileError {
    /// The file, as errors name it (`alpha/model.toml`).
    pub shown: String,
    /// What was wrong.
    pub problem: Problem,
}

/// What was wrong with a model's file.
#[derive(Debug, Clone, PartialEq, Eq, Hash, thiserror::Error)]
pub enum Problem {
    /// An absolute path, a `..`, or nothing.
    #[error("not a path inside the model's directory (a relative path without '..' is)")]
    NotRelative,
    /// A link leading out or to nothing, a FIFO, a device, a directory...
    #[error("not a regular file inside the model's directory")]
    NotRegular,
    /// Longer than the limit it is read with.
    #[error("larger than {0} bytes, the most read of it")]
    TooLarge(u64),
    /// Not UTF-8 where text was expected.
    #[error("not UTF-8 text (byte {0})")]
    NotText(usize),
    /// The file system refused (permission, I/O).
    #[error("cannot be read: {0}")]
    Io(std::io::ErrorKind),
}

impl From<FileError> for String {
    fn from(e: FileError) -> String {
        e.to_string()
    }
}

/// Reads `relative` (a path inside `dir`, the model's directory), at most
/// `limit` bytes; `Ok(None)` when there is no such file. `shown` is how
/// errors name the file (`alpha/model.toml`). See the module's doc.
pub fn read(
    dir: &Path,
    relative: &str,
    shown: &str,
    limit: u64,
) -> Result<Option<Vec<u8>>, FileError> {
    let fail = |problem| FileError {
        shown: shown.to_string(),
        problem,
    };
    let lexical = !relative.is_empty()
        && Path::new(relative)
            .components()
            .all(|c| matches!(c, Component::Normal(_)));
    if !lexical {
        return Err(fail(Problem::NotRelative));
    }
    let base = dir
        .canonicalize()
        .map_err(|e| fail(Problem::Io(e.kind())))?;
    let joined = base.join(relative);
    let resolved = match joined.canonicalize() {
        Ok(resolved) => resolved,
        // A link to nothing reads as a link leading out does.
        Err(_) if joined.symlink_metadata().is_ok() => return Err(fail(Problem::NotRegular)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(_) => return Err(fail(Problem::NotRegular)),
    };
    if !resolved.starts_with(&base) {
        return Err(fail(Problem::NotRegular));
    }
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&resolved)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::PermissionDenied => fail(Problem::Io(e.kind())),
            _ => fail(Problem::NotRegular),
        })?;
    let meta = file.metadata().map_err(|_| fail(Problem::NotRegular))?;
    if !meta.is_file() {
        return Err(fail(Problem::NotRegular));
    }
    if meta.len() > limit {
        return Err(fail(Problem::TooLarge(limit)));
    }
    // The file can grow while it is read: the limit holds anyway.
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.by_ref()
        .take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| fail(Problem::Io(e.kind())))?;
    if bytes.len() as u64 > limit {
        return Err(fail(Problem::TooLarge(limit)));
    }
    Ok(Some(bytes))
}

/// [`read`] as UTF-8 text.
pub fn read_text(
    dir: &Path,
    relative: &str,
    shown: &str,
    limit: u64,
) -> Result<Option<String>, FileError> {
    read(dir, relative, shown, limit)?
        .map(|bytes| {
            String::from_utf8(bytes).map_err(|e| FileError {
                shown: shown.to_string(),
                problem: Problem::NotText(e.utf8_error().valid_up_to()),
            })
        })
        .transpose()
}

/// A TOML parse error of `text` (the file `shown`) as its line, column and
/// what was wrong, without quoting the file's lines (toml's own display of
/// the error does).
pub fn toml_error(shown: &str, text: &str, error: &toml::de::Error) -> String {
    let message = crate::text::clip_message(error.message().trim());
    match error.span() {
        Some(span) => {
            let before = text.get(..span.start).unwrap_or(text);
            let line = before.matches('\n').count() + 1;
            let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            format!("{shown}: line {line}, column {column}: {message}")
        }
        None => format!("{shown}: {message}"),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn model_dir() -> (tempfile::TempDir, std::path::PathBuf) {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("m");
        std::fs::create_dir(&dir).unwrap();
        (root, dir)
    }

    #[test]
    fn a_regular_file_inside_is_read_and_a_missing_one_is_none() {
        let (_root, dir) = model_dir();
        std::fs::write(dir.join("model.toml"), "buckets = [1]\n").unwrap();
        std::fs::create_dir(dir.join("1")).unwrap();
        std::fs::write(dir.join("1/model.onnx"), b"onnx").unwrap();
        let read_it = |rel: &str| read(&dir, rel, "m/x", 100);
        assert_eq!(read_it("model.toml").unwrap().unwrap(), b"buckets = [1]\n");
        assert_eq!(read_it("1/model.onnx").unwrap().unwrap(), b"onnx");
        assert_eq!(read_it("labels.toml").unwrap(), None);
    }

    #[test]
    fn paths_that_leave_the_directory_are_refused_before_anything_is_opened() {
        let (root, dir) = model_dir();
        std::fs::write(root.path().join("secret"), "key").unwrap();
        for rel in ["/etc/hostname", "../secret", "a/../../secret", "", "."] {
            let error = read(&dir, rel, "m/f", 100).unwrap_err();
            assert_eq!(error.problem, Problem::NotRelative, "{rel}");
        }
    }

    #[test]
    fn links_leading_out_dangling_links_fifos_and_devices_read_alike_and_quote_nothing() {
        let (root, dir) = model_dir();
        let secret = root.path().join("secret");
        std::fs::write(&secret, "sk-live-123").unwrap();
        std::os::unix::fs::symlink(&secret, dir.join("out.toml")).unwrap();
        std::os::unix::fs::symlink(root.path().join("nothing"), dir.join("dangling")).unwrap();
        std::os::unix::fs::symlink("/dev/zero", dir.join("zero")).unwrap();
        let fifo = std::ffi::CString::new(dir.join("fifo").to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path; mkfifo reads it only.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        std::fs::create_dir(dir.join("sub")).unwrap();
        for rel in ["out.toml", "dangling", "zero", "fifo", "sub"] {
            let error = read(&dir, rel, "m/f", 100).unwrap_err().to_string();
            assert_eq!(
                error, "m/f: not a regular file inside the model's directory",
                "{rel}"
            );
        }
    }

    #[test]
    fn links_that_stay_inside_are_followed() {
        let (_root, dir) = model_dir();
        std::fs::create_dir(dir.join("..data")).unwrap();
        std::fs::write(dir.join("..data/model.toml"), "x = 1").unwrap();
        std::os::unix::fs::symlink("..data/model.toml", dir.join("model.toml")).unwrap();
        assert_eq!(
            read(&dir, "model.toml", "m/f", 100).unwrap().unwrap(),
            b"x = 1"
        );
    }

    #[test]
    fn a_file_past_the_limit_is_refused_without_its_size() {
        let (_root, dir) = model_dir();
        std::fs::write(dir.join("big"), vec![b'a'; 101]).unwrap();
        std::fs::write(dir.join("fits"), vec![b'a'; 100]).unwrap();
        let error = read(&dir, "big", "m/big", 100).unwrap_err().to_string();
        assert_eq!(error, "m/big: larger than 100 bytes, the most read of it");
        assert_eq!(
            read(&dir, "fits", "m/fits", 100).unwrap().unwrap().len(),
            100
        );
    }

    #[test]
    fn a_parse_error_names_line_and_column_and_not_the_line() {
        let text = "buckets = [1]\nsk-live-123\n";
        let error = toml::from_str::<toml::Table>(text).unwrap_err();
        let shown = toml_error("m/model.toml", text, &error);
        assert!(
            shown.starts_with("m/model.toml: line 2, column "),
            "{shown}"
        );
        assert!(!shown.contains("sk-live"), "{shown}");
    }
}
