//! File writes that either happen completely or not at all.
//!
//! Rendered user data holds a bootstrap token, so it is written to a temporary file created with
//! mode 0600 in the destination's directory, fsynced, and renamed over the destination: a reader
//! never sees half a file, a failed render never touches an existing one, and the secret is never
//! world-readable, not even for a moment.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Errors from [`write_private_atomic`].
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The temporary file could not be created, written, synced or renamed.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The destination.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
}

/// Writes `contents` to `path` atomically with mode 0600.
pub fn write_private_atomic(path: &Path, contents: &[u8]) -> Result<(), Error> {
    let wrap = |source| Error::Write {
        path: path.to_path_buf(),
        source,
    };
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    // tempfile creates the file with O_EXCL and mode 0600, in the same directory so the rename
    // below stays on one filesystem and is atomic.
    let mut tmp = tempfile::Builder::new()
        .prefix(".nodeward-")
        .tempfile_in(dir)
        .map_err(wrap)?;
    tmp.as_file()
        .set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(wrap)?;
    tmp.write_all(contents).map_err(wrap)?;
    tmp.as_file().sync_all().map_err(wrap)?;
    tmp.persist(path).map_err(|e| wrap(e.error))?;
    // Make the rename itself durable.
    File::open(dir).and_then(|d| d.sync_all()).map_err(wrap)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_0600_and_replaces() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("out.yaml");
        std::fs::write(&path, "old").expect("seed");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        write_private_atomic(&path, b"new").expect("write");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "new");
        let mode = std::fs::metadata(&path).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .expect("readdir")
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with(".nodeward-"))
            .collect();
        assert!(leftovers.is_empty(), "temporary files left behind");
    }

    #[test]
    fn missing_directory_is_an_error_naming_the_path() {
        let err = write_private_atomic(Path::new("/nonexistent-dir/x"), b"x").unwrap_err();
        assert!(err.to_string().contains("/nonexistent-dir/x"), "{err}");
    }
}
