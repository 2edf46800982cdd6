//! Saving all or nothing: the file is written beside its target under a
//! name no other save uses, flushed to the disk, then renamed over the
//! target; a failed save removes what it wrote.

use std::fs::{self, File, OpenOptions};
use std::io::{self as stdio, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Tells apart the temporary files of saves running at once in one process.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Writes `bytes` to a new file beside `path`, then renames it to `path`;
/// removes the new file if anything fails.
pub(super) fn write_atomically(path: &Path, bytes: &[u8]) -> stdio::Result<()> {
    let file_name = path.file_name().ok_or_else(|| {
        stdio::Error::new(
            stdio::ErrorKind::InvalidInput,
            format!("`{}` does not name a file", path.display()),
        )
    })?;
    let folder = match path.parent() {
        Some(folder) if !folder.as_os_str().is_empty() => folder,
        _ => Path::new("."),
    };
    let (temp_path, file) = create_temp_file(folder, &file_name.to_string_lossy())?;
    let written = write_then_rename(file, bytes, &temp_path, path);
    if written.is_err() {
        // The write's error is the one to report; the temporary file may
        // already be gone.
        let _ = fs::remove_file(&temp_path);
    }
    written
}

/// Writes `bytes` to `file` (at `temp_path`), flushes it to the disk, closes
/// it and renames it to `path`.
fn write_then_rename(
    mut file: File,
    bytes: &[u8],
    temp_path: &Path,
    path: &Path,
) -> stdio::Result<()> {
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    fs::rename(temp_path, path)
}

/// Creates a file that did not exist, named after `file_name`, in `folder`.
fn create_temp_file(folder: &Path, file_name: &str) -> stdio::Result<(PathBuf, File)> {
    const ATTEMPTS: u32 = 64;
    let mut last_error = None;
    for _ in 0..ATTEMPTS {
        let serial = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let temp_path = folder.join(format!(
            ".{file_name}.{pid}.{serial}.tmp",
            pid = std::process::id()
        ));
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&temp_path)
        {
            Ok(file) => return Ok((temp_path, file)),
            Err(error) if error.kind() == stdio::ErrorKind::AlreadyExists => {
                last_error = Some(error);
            }
            Err(error) => return Err(error),
        }
    }
    Err(last_error.unwrap_or_else(|| stdio::Error::other("no temporary file name was free")))
}
